//! Flow labels: short names a policy attaches to a session when a call it permits is
//! allowed (`@label("customer-data")`), which later policies read
//! (`context.session.labels.contains("customer-data")`).
//!
//! A label set only grows within a session and is bounded: [`MAX_LABELS`] labels of at
//! most [`MAX_LABEL_BYTES`] bytes each, from a small alphabet ([`Label::parse`]), so a
//! session's state and its audit entries stay small whatever the policies say.

use std::collections::BTreeSet;
use std::fmt;

/// The most labels one session can carry. A call whose ALLOW would add a label beyond
/// this is refused instead (dropping a label would hide what the session has touched).
pub const MAX_LABELS: usize = 32;

/// The longest label, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;

/// One flow label: 1 to [`MAX_LABEL_BYTES`] bytes of ASCII letters, digits and `.`, `_`,
/// `-`, `:`, `/`, starting with a letter or digit.
///
/// INVARIANT (label-alphabet): every `Label` passed [`Label::parse`]; the field is private.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label(Box<str>);

/// Text that is not a label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadLabel {
    /// Empty text.
    #[error("a label cannot be empty")]
    Empty,
    /// Longer than [`MAX_LABEL_BYTES`].
    #[error("label `{0}...` is longer than {MAX_LABEL_BYTES} bytes")]
    TooLong(String),
    /// A character outside the alphabet, or a first character that is not a letter or
    /// digit.
    #[error("label `{0}` may hold only ASCII letters, digits and . _ - : / (starting with a letter or digit)")]
    Character(String),
}

impl Label {
    /// Check `text` against the alphabet and length bound.
    pub fn parse(text: &str) -> Result<Label, BadLabel> {
        if text.is_empty() {
            return Err(BadLabel::Empty);
        }
        if text.len() > MAX_LABEL_BYTES {
            return Err(BadLabel::TooLong(
                text.chars().take(MAX_LABEL_BYTES).collect(),
            ));
        }
        let mut bytes = text.bytes();
        let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
        let rest_ok = bytes
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/'));
        if !(first_ok && rest_ok) {
            return Err(BadLabel::Character(text.escape_default().to_string()));
        }
        Ok(Label(text.into()))
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A session's labels: a set in label order, at most [`MAX_LABELS`].
///
/// INVARIANT (labels-bounded): `len() <= MAX_LABELS`; [`LabelSet::with`] is the only way to
/// add, and it refuses to pass the bound.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSet(BTreeSet<Label>);

/// Adding labels would pass [`MAX_LABELS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a session carries at most {MAX_LABELS} labels")]
pub struct TooManyLabels;

impl LabelSet {
    /// No labels.
    pub fn new() -> LabelSet {
        LabelSet::default()
    }

    /// Whether `label` is in the set.
    pub fn contains(&self, label: &str) -> bool {
        self.0.iter().any(|l| l.as_str() == label)
    }

    /// How many labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The labels, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Label> {
        self.0.iter()
    }

    /// The labels in `added` that are not in the set yet, in order, without duplicates.
    pub fn missing<'a>(&self, added: impl IntoIterator<Item = &'a Label>) -> Vec<Label> {
        let new: BTreeSet<&Label> = added.into_iter().filter(|l| !self.0.contains(*l)).collect();
        new.into_iter().cloned().collect()
    }

    /// This set with `added` in it, or [`TooManyLabels`] (and the set unchanged) when the
    /// union would pass [`MAX_LABELS`]. Labels already present are not counted twice.
    pub fn with<'a>(
        &self,
        added: impl IntoIterator<Item = &'a Label>,
    ) -> Result<LabelSet, TooManyLabels> {
        let mut out = self.0.clone();
        for l in added {
            if !out.contains(l) {
                if out.len() >= MAX_LABELS {
                    return Err(TooManyLabels);
                }
                out.insert(l.clone());
            }
        }
        Ok(LabelSet(out))
    }
}

impl<'a> IntoIterator for &'a LabelSet {
    type Item = &'a Label;
    type IntoIter = std::collections::btree_set::Iter<'a, Label>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_have_a_small_alphabet_and_a_length_bound() {
        for ok in ["customer-data", "pii", "a", "x.y_z:w/1", "9lives"] {
            assert_eq!(Label::parse(ok).unwrap().as_str(), ok);
        }
        assert_eq!(Label::parse(""), Err(BadLabel::Empty));
        assert!(matches!(Label::parse("-x"), Err(BadLabel::Character(_))));
        assert!(matches!(Label::parse("a b"), Err(BadLabel::Character(_))));
        assert!(matches!(Label::parse("é"), Err(BadLabel::Character(_))));
        assert!(Label::parse(&"a".repeat(MAX_LABEL_BYTES)).is_ok());
        assert!(matches!(
            Label::parse(&"a".repeat(MAX_LABEL_BYTES + 1)),
            Err(BadLabel::TooLong(_))
        ));
    }

    #[test]
    fn a_set_refuses_to_pass_its_bound_and_counts_present_labels_once() {
        let labels: Vec<Label> = (0..MAX_LABELS)
            .map(|i| Label::parse(&format!("l{i}")).unwrap())
            .collect();
        let full = LabelSet::new().with(&labels).unwrap();
        assert_eq!(full.len(), MAX_LABELS);
        // Present labels again: fine.
        assert_eq!(full.with(&labels[..3]).unwrap(), full);
        let extra = Label::parse("extra").unwrap();
        assert_eq!(full.with([&extra]), Err(TooManyLabels));
        assert_eq!(full.missing([&extra, &labels[0], &extra]), vec![extra]);
        assert!(full.contains("l0") && !full.contains("l99"));
    }
}
