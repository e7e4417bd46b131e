//! Text classification data: a basic tokenizer, a vocabulary, and a reader for
//! `label<TAB>text` files (one sample per line), the layout of many public sets (AG News, SST-2,
//! IMDB exports) once converted.

use super::files::{MAX_PAYLOAD, io_error, open};
use crate::error::{Error, Result};
use crate::io::dataset::{Dataset, out_of_range};
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// Lower-cased tokens of `text`, as BERT's basic tokenizer splits it: whitespace separates
/// tokens, each punctuation or symbol character and each CJK ideograph is a token of its own,
/// control characters are dropped.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let flush = |word: &mut String, tokens: &mut Vec<String>| {
        if !word.is_empty() {
            tokens.push(std::mem::take(word));
        }
    };
    for ch in text.chars() {
        if ch.is_whitespace() {
            flush(&mut word, &mut tokens);
        } else if ch.is_control() {
            continue;
        } else if ch.is_ascii_punctuation() || (!ch.is_alphanumeric() && !ch.is_ascii()) || is_cjk(ch) {
            flush(&mut word, &mut tokens);
            tokens.push(ch.to_lowercase().collect());
        } else {
            word.extend(ch.to_lowercase());
        }
    }
    flush(&mut word, &mut tokens);
    tokens
}

/// CJK Unified Ideographs and their extensions (BERT's `_is_chinese_char` ranges).
fn is_cjk(ch: char) -> bool {
    matches!(ch as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// A token ↔ id table. Id 0 is [`Vocab::PAD`], id 1 [`Vocab::UNK`] (what unknown tokens map
/// to); the rest follow.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocab {
    tokens: Vec<String>,
    index: HashMap<String, usize>,
}

impl Vocab {
    /// The padding token (id 0).
    pub const PAD: &'static str = "<pad>";
    /// The unknown-token token (id 1).
    pub const UNK: &'static str = "<unk>";

    /// A vocabulary of the tokens seen at least `min_freq` times, most frequent first (ties in
    /// alphabetical order, so the ids are deterministic), at most `max_size` ids in all
    /// (the two special tokens included).
    pub fn build<S: AsRef<str>>(
        tokens: impl IntoIterator<Item = S>,
        min_freq: usize,
        max_size: Option<usize>,
    ) -> Vocab {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for t in tokens {
            *counts.entry(t.as_ref().to_string()).or_default() += 1;
        }
        counts.remove(Vocab::PAD);
        counts.remove(Vocab::UNK);
        let mut by_freq: Vec<(String, usize)> = counts.into_iter().filter(|(_, c)| *c >= min_freq.max(1)).collect();
        by_freq.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let keep = max_size.map_or(usize::MAX, |m| m.saturating_sub(2));
        let tokens = [Vocab::PAD.to_string(), Vocab::UNK.to_string()]
            .into_iter()
            .chain(by_freq.into_iter().take(keep).map(|(t, _)| t))
            .collect();
        Vocab::indexed(tokens)
    }

    fn indexed(tokens: Vec<String>) -> Vocab {
        let index = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i)).collect();
        Vocab { tokens, index }
    }

    /// A vocabulary from its tokens in id order (a `vocab.txt`'s lines); the first two must be
    /// [`Vocab::PAD`] and [`Vocab::UNK`], and no token may repeat.
    pub fn from_tokens(tokens: Vec<String>) -> Result<Vocab> {
        if tokens.len() < 2 || tokens[0] != Vocab::PAD || tokens[1] != Vocab::UNK {
            return Err(Error::invalid(
                "Vocab",
                format!("ids 0 and 1 must be {} and {}", Vocab::PAD, Vocab::UNK),
            ));
        }
        let v = Vocab::indexed(tokens);
        if v.index.len() != v.tokens.len() {
            let mut seen = std::collections::HashSet::new();
            let dup = v.tokens.iter().find(|t| !seen.insert(*t)).cloned().unwrap_or_default();
            return Err(Error::invalid("Vocab", format!("token {dup:?} appears twice")));
        }
        Ok(v)
    }

    /// Read a vocabulary written by [`Vocab::save`] (one token per line, in id order).
    pub fn load(path: impl AsRef<Path>) -> Result<Vocab> {
        let path = path.as_ref();
        let bytes = open(path)?.read_all(path, MAX_PAYLOAD)?;
        let text = String::from_utf8(bytes).map_err(|e| io_error(path, format!("not UTF-8: {e}")))?;
        Vocab::from_tokens(text.lines().map(str::to_string).collect()).map_err(|e| io_error(path, e.to_string()))
    }

    /// Write one token per line, in id order (atomically: a temporary file renamed).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if let Some(bad) = self.tokens.iter().find(|t| t.contains('\n')) {
            return Err(io_error(path, format!("token {bad:?} holds a line break")));
        }
        let mut text = self.tokens.join("\n");
        text.push('\n');
        oar_ir::file::write_atomically(path, text.as_bytes()).map_err(|e| io_error(path, e.to_string()))
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: a vocabulary holds at least the two special tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The id of `token` ([`Vocab::UNK`]'s if it is not in the vocabulary).
    pub fn id(&self, token: &str) -> usize {
        self.index.get(token).copied().unwrap_or(1)
    }

    /// The token with id `id`.
    pub fn token(&self, id: usize) -> Option<&str> {
        self.tokens.get(id).map(String::as_str)
    }

    /// Ids of `tokens`, truncated or padded (with id 0) to `len`.
    pub fn encode<S: AsRef<str>>(&self, tokens: &[S], len: usize) -> Vec<i64> {
        let mut ids: Vec<i64> = tokens.iter().take(len).map(|t| self.id(t.as_ref()) as i64).collect();
        ids.resize(len, 0);
        ids
    }
}

/// Labelled texts from a `label<TAB>text` file, tokenized with [`tokenize`] and encoded with a
/// [`Vocab`] to `max_len` ids (truncated or padded with 0). Samples are i64 ids `[max_len]` and
/// an i64 scalar label: the label's position among the [`classes`](Self::classes).
pub struct TextClassification {
    ids: Vec<i64>,
    labels: Vec<i64>,
    max_len: usize,
    classes: Vec<String>,
    vocab: Vocab,
}

impl TextClassification {
    /// Read a training file: its classes (sorted; numerically when every label is an integer)
    /// and a vocabulary of its tokens seen at least `min_freq` times.
    pub fn from_tsv(path: impl AsRef<Path>, max_len: usize, min_freq: usize) -> Result<TextClassification> {
        let path = path.as_ref();
        let rows = read_rows(path)?;
        let mut classes: Vec<String> = rows.iter().map(|(l, _)| l.clone()).collect();
        classes.sort();
        classes.dedup();
        if classes.iter().all(|c| c.parse::<i64>().is_ok()) {
            classes.sort_by_key(|c| c.parse::<i64>().unwrap_or_default());
        }
        let vocab = Vocab::build(rows.iter().flat_map(|(_, t)| t.iter()), min_freq, None);
        TextClassification::encode(path, rows, max_len, classes, vocab)
    }

    /// Read another split with a training set's vocabulary and classes (a label not among them
    /// is an error naming the line).
    pub fn from_tsv_with(
        path: impl AsRef<Path>,
        max_len: usize,
        vocab: Vocab,
        classes: Vec<String>,
    ) -> Result<TextClassification> {
        let path = path.as_ref();
        TextClassification::encode(path, read_rows(path)?, max_len, classes, vocab)
    }

    fn encode(
        path: &Path,
        rows: Vec<(String, Vec<String>)>,
        max_len: usize,
        classes: Vec<String>,
        vocab: Vocab,
    ) -> Result<TextClassification> {
        if max_len == 0 {
            return Err(io_error(path, "max_len must be at least 1"));
        }
        let index: HashMap<&str, usize> = classes.iter().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
        let mut ids = Vec::with_capacity(rows.len() * max_len);
        let mut labels = Vec::with_capacity(rows.len());
        for (line, (label, tokens)) in rows.iter().enumerate() {
            let Some(&l) = index.get(label.as_str()) else {
                return Err(io_error(
                    path,
                    format!(
                        "line {}: label {label:?} is not one of the classes {classes:?}",
                        line + 1
                    ),
                ));
            };
            labels.push(l as i64);
            ids.extend(vocab.encode(tokens, max_len));
        }
        Ok(TextClassification {
            ids,
            labels,
            max_len,
            classes,
            vocab,
        })
    }

    /// The vocabulary the texts were encoded with.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// The class names, indexed by label.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }
}

/// `(label, tokens)` per non-empty line of a `label<TAB>text` file.
fn read_rows(path: &Path) -> Result<Vec<(String, Vec<String>)>> {
    let bytes = open(path)?.read_all(path, MAX_PAYLOAD)?;
    let text = String::from_utf8(bytes).map_err(|e| io_error(path, format!("not UTF-8: {e}")))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((label, body)) = line.split_once('\t') else {
            return Err(io_error(path, format!("line {}: expected `label<TAB>text`", i + 1)));
        };
        let label = label.trim();
        if label.is_empty() {
            return Err(io_error(path, format!("line {}: empty label", i + 1)));
        }
        rows.push((label.to_string(), tokenize(body)));
    }
    if rows.is_empty() {
        return Err(io_error(path, "no samples (expected `label<TAB>text` lines)"));
    }
    Ok(rows)
}

impl Dataset for TextClassification {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        let label = *self
            .labels
            .get(index)
            .ok_or_else(|| out_of_range("TextClassification", index, self.labels.len()))?;
        let ids = self.ids[index * self.max_len..(index + 1) * self.max_len].to_vec();
        Ok((Tensor::from_vec(ids, &[self.max_len])?, Tensor::scalar(label)))
    }
}
