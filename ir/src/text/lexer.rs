//! Tokens of the text format, with their line and column.

use super::ParseError;

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tok {
    /// `%name` or `%name#k`: a value reference or definition.
    Value {
        /// The name after `%`.
        name: String,
        /// The result index after `#`, if written.
        result: Option<String>,
    },
    /// `@name` or `@"any text"`: a graph name.
    At(String),
    /// A bare word: op mnemonics, keywords, dtypes, symbolic dims, `true`, `inf`.
    Ident(String),
    /// A numeric literal as written (`-3`, `1.5e-7`, `0x7FC00001`, `-inf`); contexts convert it.
    Number(String),
    /// A double-quoted string, unescaped.
    Str(String),
    /// One punctuation character: `( ) [ ] { } < > , = : * + /`.
    Punct(char),
    /// End of input.
    Eof,
}

impl Tok {
    /// How the token reads in an error message.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Value { name, result: None } => format!("'%{name}'"),
            Tok::Value { name, result: Some(r) } => format!("'%{name}#{r}'"),
            Tok::At(n) => format!("'@{n}'"),
            Tok::Ident(s) | Tok::Number(s) => format!("'{s}'"),
            Tok::Str(s) => format!("string {}", super::print::quote(s)),
            Tok::Punct(c) => format!("'{c}'"),
            Tok::Eof => "end of input".into(),
        }
    }
}

/// A token and where it starts (1-based line and column, columns counted in characters).
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: usize,
    pub col: usize,
}

/// Characters allowed in bare names (`%x.1`, `@mlp`, `fc1.weight`, `reduce_sum`).
pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// True if `s` prints bare as an identifier: a letter or `_` first, then name characters.
pub(crate) fn is_ident(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && cs.all(is_name_char)
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    col: usize,
}

impl Lexer<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn err(&self, line: usize, col: usize, msg: String) -> ParseError {
        ParseError { line, col, msg }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek().filter(|&c| f(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    /// A number: optional `-`, then name characters, with `+`/`-` allowed right after an
    /// exponent `e` of a decimal literal.
    fn number(&mut self) -> String {
        let mut s = String::new();
        if self.peek() == Some('-') {
            s.push('-');
            self.bump();
        }
        while let Some(c) = self.peek() {
            let hex = s.trim_start_matches('-').starts_with("0x");
            let exp_sign = (c == '+' || c == '-') && !hex && s.ends_with(['e', 'E']);
            if !(is_name_char(c) || exp_sign) {
                break;
            }
            s.push(c);
            self.bump();
        }
        s
    }

    fn string(&mut self, line: usize, col: usize) -> Result<String, ParseError> {
        self.bump(); // opening quote
        let mut s = String::new();
        loop {
            let (l, c) = (self.line, self.col);
            match self.bump() {
                None | Some('\n') => return Err(self.err(line, col, "unterminated string".into())),
                Some('"') => return Ok(s),
                Some('\\') => match self.bump() {
                    Some('"') => s.push('"'),
                    Some('\\') => s.push('\\'),
                    Some('n') => s.push('\n'),
                    Some('t') => s.push('\t'),
                    Some('r') => s.push('\r'),
                    Some('u') => {
                        let bad = || ParseError {
                            line: l,
                            col: c,
                            msg: "bad unicode escape (expected \\u{XXXX})".into(),
                        };
                        if self.bump() != Some('{') {
                            return Err(bad());
                        }
                        let hex = self.take_while(|c| c.is_ascii_hexdigit());
                        if self.bump() != Some('}') || hex.is_empty() || hex.len() > 6 {
                            return Err(bad());
                        }
                        let ch = u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or_else(bad)?;
                        s.push(ch);
                    }
                    other => {
                        let shown = other.map_or("end of input".to_string(), |c| format!("'\\{c}'"));
                        return Err(self.err(l, c, format!("unknown escape {shown} in string")));
                    }
                },
                Some(ch) => s.push(ch),
            }
        }
    }
}

/// Split `text` into tokens; comments (`// ...` to the end of the line) are skipped.
pub(crate) fn tokenize(text: &str) -> Result<Vec<Token>, ParseError> {
    let mut lx = Lexer {
        chars: text.chars().peekable(),
        line: 1,
        col: 1,
    };
    let mut out = Vec::new();
    loop {
        let (line, col) = (lx.line, lx.col);
        let Some(c) = lx.peek() else {
            out.push(Token {
                tok: Tok::Eof,
                line,
                col,
            });
            return Ok(out);
        };
        let tok = match c {
            c if c.is_whitespace() => {
                lx.bump();
                continue;
            }
            '/' => {
                lx.bump();
                if lx.peek() != Some('/') {
                    // Floor division in a size expression (`N/2`).
                    out.push(Token {
                        tok: Tok::Punct('/'),
                        line,
                        col,
                    });
                    continue;
                }
                lx.take_while(|c| c != '\n');
                continue;
            }
            '%' => {
                lx.bump();
                let name = lx.take_while(is_name_char);
                if name.is_empty() {
                    return Err(lx.err(line, col, "expected a value name after '%'".into()));
                }
                let result = if lx.peek() == Some('#') {
                    lx.bump();
                    let r = lx.take_while(|c| c.is_ascii_alphanumeric());
                    if r.is_empty() {
                        return Err(lx.err(line, col, format!("expected a result number after '%{name}#'")));
                    }
                    Some(r)
                } else {
                    None
                };
                Tok::Value { name, result }
            }
            '@' => {
                lx.bump();
                if lx.peek() == Some('"') {
                    let (l, c) = (lx.line, lx.col);
                    Tok::At(lx.string(l, c)?)
                } else {
                    let name = lx.take_while(is_name_char);
                    if name.is_empty() {
                        return Err(lx.err(line, col, "expected a graph name after '@'".into()));
                    }
                    Tok::At(name)
                }
            }
            '"' => Tok::Str(lx.string(line, col)?),
            '(' | ')' | '[' | ']' | '{' | '}' | '<' | '>' | ',' | '=' | ':' | '*' | '+' => {
                lx.bump();
                Tok::Punct(c)
            }
            // `-(` starts a negated group in a size expression (`f32[-(N/2)+M]`).
            '-' if lx.chars.clone().nth(1) == Some('(') => {
                lx.bump();
                Tok::Punct('-')
            }
            '-' => {
                let n = lx.number();
                if n == "-" {
                    return Err(lx.err(line, col, "expected a number after '-'".into()));
                }
                Tok::Number(n)
            }
            c if c.is_ascii_digit() => Tok::Number(lx.number()),
            c if c.is_ascii_alphabetic() || c == '_' => Tok::Ident(lx.take_while(is_name_char)),
            c => return Err(lx.err(line, col, format!("unexpected character {c:?}"))),
        };
        out.push(Token { tok, line, col });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_positions() {
        let t = tokenize("%4#1 = f32[N,3] // hi\n  -1.5e-7 \"a\\\"\\u{e9}\" @\"x y\" -inf").unwrap();
        let toks: Vec<_> = t.iter().map(|t| t.tok.clone()).collect();
        assert_eq!(
            toks,
            vec![
                Tok::Value {
                    name: "4".into(),
                    result: Some("1".into())
                },
                Tok::Punct('='),
                Tok::Ident("f32".into()),
                Tok::Punct('['),
                Tok::Ident("N".into()),
                Tok::Punct(','),
                Tok::Number("3".into()),
                Tok::Punct(']'),
                Tok::Number("-1.5e-7".into()),
                Tok::Str("a\"é".into()),
                Tok::At("x y".into()),
                Tok::Number("-inf".into()),
                Tok::Eof,
            ]
        );
        assert_eq!((t[8].line, t[8].col), (2, 3));
        let e = tokenize("\n  $").unwrap_err();
        assert_eq!((e.line, e.col), (2, 3));
        assert!(tokenize("\"abc").unwrap_err().msg.contains("unterminated"));
    }
}
