//! Man pages: each `docs/man/*.md` page (named `NAME.SECTION.md`) rendered to roff.
//!
//! The Markdown pages are the only source of each page (they read well on the
//! web, and `man` gets the same text). They use a small, fixed subset, the one
//! go-md2man and pandoc understand too, and the renderer refuses anything else
//! rather than print it wrong:
//!
//! * `% NAME SECTION` first line (the title);
//! * `## HEADING`, `### SUBHEADING`;
//! * paragraphs; `* ` bullet lists (continued by lines indented two spaces);
//! * definition lists: one or more term lines (several terms joined by a
//!   trailing `\`), then `:   ` and the body, continued by lines indented four
//!   spaces (blank lines inside are fine; a body may hold paragraphs, bullet
//!   lists and code blocks indented four more spaces);
//! * fenced code blocks (```` ``` ````);
//! * inline `**bold**`, `*italic*` and `` `code` `` (shown bold).
//!
//! Tables, links, HTML and `#` headings are errors.

use std::fmt::Write as _;

/// A page that cannot be rendered, with the line that is the problem.
#[derive(Debug)]
pub struct RenderError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// The title of a page: `% NAME SECTION`.
pub fn title(source: &str) -> Option<(String, String)> {
    let first = source.lines().next()?.strip_prefix("% ")?;
    let mut words = first.split_whitespace();
    let (name, section) = (words.next()?, words.next()?);
    words
        .next()
        .is_none()
        .then(|| (name.to_string(), section.to_string()))
}

/// Renders one page. `version` goes into the footer (`drover VERSION`).
pub fn render(source: &str, version: &str) -> Result<String, RenderError> {
    let lines: Vec<&str> = source.lines().collect();
    let (name, section) = title(source).ok_or(RenderError {
        line: 1,
        message: "the first line must be '% NAME SECTION'".into(),
    })?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        ".\\\" Generated from docs/man/{name}.{section}.md; edit that file, not this one.\n\
         .TH \"{}\" \"{section}\" \"\" \"drover {version}\" \"drover\"\n\
         .nh\n.ad l",
        name.to_uppercase()
    );
    let body: Vec<(usize, &str)> = lines
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, l)| (i + 1, *l))
        .collect();
    render_blocks(&body, &mut out, false)?;
    Ok(out)
}

fn err(line: usize, message: impl Into<String>) -> RenderError {
    RenderError {
        line,
        message: message.into(),
    }
}

/// Renders a run of lines (already stripped of any definition-body indent).
/// `in_body`: inside a definition body, where paragraphs keep the indent.
fn render_blocks(
    lines: &[(usize, &str)],
    out: &mut String,
    in_body: bool,
) -> Result<(), RenderError> {
    let mut i = 0;
    // The first paragraph of a body follows its .TP tag directly.
    let mut first_in_body = in_body;
    while i < lines.len() {
        let (no, line) = lines[i];
        if line.trim().is_empty() {
            i += 1;
            continue;
        }
        let para = |out: &mut String, first: &mut bool| {
            if *first {
                *first = false;
            } else if in_body {
                out.push_str(".IP\n");
            } else {
                out.push_str(".PP\n");
            }
        };
        if let Some(h) = line.strip_prefix("## ") {
            if in_body {
                return Err(err(no, "a heading inside a definition"));
            }
            let _ = writeln!(out, ".SH {}", heading(h));
            i += 1;
        } else if let Some(h) = line.strip_prefix("### ") {
            if in_body {
                return Err(err(no, "a heading inside a definition"));
            }
            let _ = writeln!(out, ".SS {}", heading(h));
            i += 1;
        } else if line.starts_with('#') {
            return Err(err(no, "only ## and ### headings are supported"));
        } else if line.starts_with("```") {
            let mut code = Vec::new();
            i += 1;
            loop {
                let Some(&(_, l)) = lines.get(i) else {
                    return Err(err(no, "unterminated code block"));
                };
                i += 1;
                if l.starts_with("```") {
                    break;
                }
                code.push(l);
            }
            para(out, &mut first_in_body);
            code_block(&code, out, in_body);
        } else if line.starts_with("    ") {
            // An indented code block (inside a definition body).
            let mut code = Vec::new();
            while let Some(&(_, l)) = lines.get(i) {
                if let Some(rest) = l.strip_prefix("    ") {
                    code.push(rest);
                } else if l.trim().is_empty()
                    && lines.get(i + 1).is_some_and(|(_, n)| n.starts_with("    "))
                {
                    code.push("");
                } else {
                    break;
                }
                i += 1;
            }
            para(out, &mut first_in_body);
            code_block(&code, out, in_body);
        } else if line.starts_with("* ") {
            while let Some(&(no, l)) = lines.get(i) {
                let Some(item) = l.strip_prefix("* ") else {
                    break;
                };
                let mut text = vec![(no, item)];
                i += 1;
                while let Some(&(n, c)) = lines.get(i) {
                    match c.strip_prefix("  ") {
                        Some(rest) if !rest.trim().is_empty() && !rest.starts_with(' ') => {
                            text.push((n, rest));
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push_str(if in_body {
                    ".RS\n.IP \\(bu 2\n"
                } else {
                    ".IP \\(bu 2\n"
                });
                inline_lines(&text, out)?;
                if in_body {
                    out.push_str(".RE\n");
                }
            }
            first_in_body = false;
        } else if line.starts_with('|') {
            return Err(err(
                no,
                "tables are not supported in man pages; use a definition list",
            ));
        } else if line.starts_with(":   ") {
            return Err(err(no, "a definition body without a term"));
        } else {
            // A paragraph, or the terms of a definition.
            let start = i;
            while i < lines.len()
                && !lines[i].1.trim().is_empty()
                && !lines[i].1.starts_with(":   ")
                && !lines[i].1.starts_with("```")
            {
                i += 1;
            }
            let text = &lines[start..i];
            if lines.get(i).is_some_and(|(_, l)| l.starts_with(":   ")) {
                if in_body {
                    return Err(err(no, "a definition list inside a definition"));
                }
                definition(text, lines, &mut i, out)?;
            } else {
                para(out, &mut first_in_body);
                inline_lines(text, out)?;
            }
        }
    }
    Ok(())
}

/// `terms` are the term lines; `lines[*i]` is the `:   ` line. Consumes the body.
fn definition(
    terms: &[(usize, &str)],
    lines: &[(usize, &str)],
    i: &mut usize,
    out: &mut String,
) -> Result<(), RenderError> {
    for (k, &(no, term)) in terms.iter().enumerate() {
        let term = term.strip_suffix('\\').unwrap_or(term);
        if k + 1 < terms.len() && !terms[k].1.ends_with('\\') {
            return Err(err(no, "several terms must be joined by a trailing '\\'"));
        }
        out.push_str(if k == 0 { ".TP\n" } else { ".TQ\n" });
        out.push_str(&inline(term).map_err(|m| err(no, m))?);
        out.push('\n');
    }
    let mut body: Vec<(usize, &str)> = Vec::new();
    let (no, first) = lines[*i];
    body.push((no, &first[4..]));
    *i += 1;
    while let Some(&(n, l)) = lines.get(*i) {
        if let Some(rest) = l.strip_prefix("    ") {
            body.push((n, rest));
        } else if l.trim().is_empty()
            && lines[*i + 1..]
                .iter()
                .find(|(_, x)| !x.trim().is_empty())
                .is_some_and(|(_, x)| x.starts_with("    "))
        {
            body.push((n, ""));
        } else {
            break;
        }
        *i += 1;
    }
    render_blocks(&body, out, true)
}

/// A code block, indented four columns more than the text around it (inside a
/// definition body `.RS` would count from the page margin, so spaces do it).
fn code_block(code: &[&str], out: &mut String, in_body: bool) {
    out.push_str(if in_body { ".nf\n" } else { ".RS 4\n.nf\n" });
    for l in code {
        let line = escape(l);
        if in_body {
            out.push_str("    ");
            out.push_str(&line);
        } else {
            out.push_str(&escape_line(&line));
        }
        out.push('\n');
    }
    out.push_str(if in_body { ".fi\n" } else { ".fi\n.RE\n" });
}

fn heading(h: &str) -> String {
    let text = escape(h.trim());
    if text.contains(' ') {
        format!("\"{text}\"")
    } else {
        text
    }
}

/// A paragraph's lines, rendered as a whole: a code span or emphasis may
/// continue on the next line, as in Markdown. A trailing `\\` breaks the line.
fn inline_lines(text: &[(usize, &str)], out: &mut String) -> Result<(), RenderError> {
    const BREAK: char = '\u{1}';
    let mut joined = String::new();
    for (k, &(_, l)) in text.iter().enumerate() {
        let l = l.trim();
        if k > 0 {
            joined.push('\n');
        }
        match l.strip_suffix('\\') {
            Some(rest) => {
                joined.push_str(rest);
                joined.push('\n');
                joined.push(BREAK);
            }
            None => joined.push_str(l),
        }
    }
    let first = text.first().map_or(0, |(no, _)| *no);
    let roff = inline(&joined).map_err(|m| err(first, m))?;
    for line in roff.split('\n') {
        if line == BREAK.to_string() {
            out.push_str(".br\n");
        } else {
            out.push_str(&escape_line(line));
            out.push('\n');
        }
    }
    Ok(())
}

/// Roff-escapes text: backslashes, hyphens (so options copy as ASCII '-').
fn escape(s: &str) -> String {
    s.replace('\\', "\\e").replace('-', "\\-")
}

/// A line must not start with a control character ('.' or '\'').
fn escape_line(s: &str) -> String {
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s.to_string()
    }
}

/// One line of Markdown inline syntax to roff.
fn inline(s: &str) -> Result<String, String> {
    if s.contains("](") || s.contains("<a ") || s.contains("<br") {
        return Err("links and HTML are not supported in man pages".into());
    }
    let mut out = String::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut plain = String::new();
    let flush = |plain: &mut String, out: &mut String| {
        out.push_str(&escape(plain));
        plain.clear();
    };
    let find = |from: usize, pat: &[char]| -> Option<usize> {
        (from..chars.len()).find(|&k| chars[k..].starts_with(pat))
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '`' {
            let end = find(i + 1, &['`']).ok_or("unclosed `code`")?;
            flush(&mut plain, &mut out);
            let code: String = chars[i + 1..end].iter().collect();
            let _ = write!(out, "\\fB{}\\fR", escape(&code));
            i = end + 1;
        } else if chars[i..].starts_with(&['*', '*']) {
            let end = find(i + 2, &['*', '*']).ok_or("unclosed **bold**")?;
            flush(&mut plain, &mut out);
            let inner: String = chars[i + 2..end].iter().collect();
            let _ = write!(out, "\\fB{}\\fR", inline_italic_only(&inner)?);
            i = end + 2;
        } else if c == '*' && chars.get(i + 1).is_some_and(|n| !n.is_whitespace()) {
            let end = find(i + 1, &['*']).ok_or("unclosed *italic*")?;
            flush(&mut plain, &mut out);
            let inner: String = chars[i + 1..end].iter().collect();
            let _ = write!(out, "\\fI{}\\fR", escape(&inner));
            i = end + 1;
        } else {
            plain.push(c);
            i += 1;
        }
    }
    flush(&mut plain, &mut out);
    Ok(escape_line(&out))
}

#[cfg(test)]
#[test]
fn spans_continue_across_lines() {
    let mut out = String::new();
    inline_lines(&[(1, "a `code"), (2, ".more` b\\"), (3, "c")], &mut out).unwrap();
    assert_eq!(out, "a \\fBcode\n\\&.more\\fR b\n.br\nc\n");
}

/// Inside bold: code spans stay bold, nothing else nests.
fn inline_italic_only(s: &str) -> Result<String, String> {
    if s.contains('*') {
        return Err(format!("nested emphasis in '**{s}**'"));
    }
    Ok(escape(&s.replace('`', "")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(md: &str) -> String {
        let page = render(&format!("% x 1\n{md}"), "9.9").unwrap();
        page.split_once(".ad l\n").unwrap().1.to_string()
    }

    #[test]
    fn title_and_header() {
        let page = render(
            "% drover-agent 8\n\n## NAME\n\ndrover-agent - the agent\n",
            "1.2.3",
        )
        .unwrap();
        assert!(
            page.contains(".TH \"DROVER-AGENT\" \"8\" \"\" \"drover 1.2.3\" \"drover\"\n"),
            "{page}"
        );
        assert!(
            page.contains(".SH NAME\n.PP\ndrover\\-agent \\- the agent\n"),
            "{page}"
        );
        assert_eq!(
            title("% drover.conf 5\n"),
            Some(("drover.conf".into(), "5".into()))
        );
        assert!(render("# NAME\n", "1").is_err());
    }

    #[test]
    fn inline_markup() {
        assert_eq!(
            body("Use **--bus** *ADDRESS*, `a\\b` or `*`.\n"),
            ".PP\nUse \\fB\\-\\-bus\\fR \\fIADDRESS\\fR, \\fBa\\eb\\fR or \\fB*\\fR.\n"
        );
        // A line starting with a dot is not a roff request.
        assert_eq!(body(".conf files\n"), ".PP\n\\&.conf files\n");
        assert!(render("% x 1\nsee [this](http://x)\n", "1").is_err());
        assert!(render("% x 1\nun**closed\n", "1").is_err());
    }

    #[test]
    fn definition_lists_with_several_terms_paragraphs_and_code() {
        let md = "**start** *UNIT*\\\n**stop** *UNIT*\n:   Start or stop.\n    More.\n\n    Second paragraph.\n\n        code line\n\n**next**\n:   Body.\n";
        assert_eq!(
            body(md),
            ".TP\n\\fBstart\\fR \\fIUNIT\\fR\n.TQ\n\\fBstop\\fR \\fIUNIT\\fR\nStart or stop.\nMore.\n\
             .IP\nSecond paragraph.\n.IP\n.nf\n    code line\n.fi\n.TP\n\\fBnext\\fR\nBody.\n"
        );
    }

    #[test]
    fn bullets_and_fenced_code() {
        assert_eq!(
            body("* one\n  continued\n* two\n\n```\n.dot\n$ x -y\n```\n"),
            ".IP \\(bu 2\none\ncontinued\n.IP \\(bu 2\ntwo\n.PP\n.RS 4\n.nf\n\\&.dot\n$ x \\-y\n.fi\n.RE\n"
        );
    }

    #[test]
    fn unsupported_syntax_is_an_error_with_its_line() {
        let e = render("% x 1\n\n| a | b |\n", "1").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("tables"));
        let e = render("% x 1\n\n```\nopen\n", "1").unwrap_err();
        assert!(e.message.contains("unterminated"));
    }
}
