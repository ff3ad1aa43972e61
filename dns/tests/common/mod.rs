//! `dig` (bind9-dnsutils), the real DNS client the tests ask with, and what
//! it printed, parsed: status, flags, the records of each section.

#![allow(dead_code)]

use std::net::SocketAddr;

/// One `dig` run.
#[derive(Debug, Clone, Default)]
pub struct Dig {
    pub status: String,
    pub flags: Vec<String>,
    /// (name, ttl, type, data)
    pub answer: Vec<(String, u32, String, String)>,
    pub authority: Vec<(String, u32, String, String)>,
    pub additional: Vec<(String, u32, String, String)>,
    pub raw: String,
}

impl Dig {
    pub fn answer_data(&self) -> Vec<String> {
        let mut v: Vec<String> = self.answer.iter().map(|r| r.3.clone()).collect();
        v.sort();
        v
    }

    pub fn authority_types(&self) -> Vec<String> {
        self.authority.iter().map(|r| r.2.clone()).collect()
    }
}

/// `dig @HOST -p PORT ARGS...` with one try and a short timeout.
pub async fn dig(server: SocketAddr, args: &[&str]) -> Dig {
    let out = tokio::process::Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .args([
            "+tries=1",
            "+time=5",
            "+nocookie",
            "+noall",
            "+comments",
            "+answer",
            "+authority",
            "+additional",
        ])
        .args(args)
        .output()
        .await
        .expect("dig runs (package bind9-dnsutils)");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    parse(&raw)
}

fn parse(raw: &str) -> Dig {
    let mut d = Dig {
        raw: raw.to_string(),
        ..Dig::default()
    };
    let mut section = "";
    for line in raw.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            d.status = rest.split(',').next().unwrap_or_default().to_string();
        } else if let Some(rest) = line.strip_prefix(";; flags: ") {
            d.flags = rest
                .split(';')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect();
        } else if line.starts_with(";; ANSWER SECTION") {
            section = "answer";
        } else if line.starts_with(";; AUTHORITY SECTION") {
            section = "authority";
        } else if line.starts_with(";; ADDITIONAL SECTION") {
            section = "additional";
        } else if line.starts_with(';') || line.trim().is_empty() {
            if line.trim().is_empty() {
                section = "";
            }
        } else {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 4 {
                let rec = (
                    f[0].to_string(),
                    f[1].parse().unwrap_or(u32::MAX),
                    f[3].to_string(),
                    f[4..].join(" "),
                );
                match section {
                    "answer" => d.answer.push(rec),
                    "authority" => d.authority.push(rec),
                    "additional" => d.additional.push(rec),
                    _ => {}
                }
            }
        }
    }
    d
}
