//! `drover-pki`: certificates for drover's mutual TLS; everything lives in
//! `drover_tls::pki_cli`.

fn main() -> std::process::ExitCode {
    drover_tls::pki_cli::main()
}
