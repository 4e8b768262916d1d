//! A memory thread's messages: the texts as written, in order, indexed by id.

use crate::store::{RawJson, StoredMessage};
use std::collections::HashMap;

/// A message as the text it was written as: a load and the readers copy the texts out (the
/// search of `list_messages` looks at its `content` only).
pub(super) struct Kept {
    pub(super) id: String,
    pub(super) text: RawJson,
}

impl Kept {
    pub(super) fn new(m: &StoredMessage) -> Self {
        Kept { id: m.id.clone(), text: m.data.clone() }
    }
}

/// A thread's messages in order, with an index from id to position: finding a message by id
/// was a scan of the list, so an input of n messages cost O(n^2) (50,000 messages: 11 s, under
/// the store's one lock) and every step O(history).
#[derive(Default)]
pub(super) struct Messages {
    list: Vec<Kept>,
    at: HashMap<String, usize>,
}

impl Messages {
    pub(super) fn upsert(&mut self, m: &StoredMessage) {
        match self.at.get(&m.id) {
            Some(&i) => self.list[i] = Kept::new(m),
            None => {
                self.at.insert(m.id.clone(), self.list.len());
                self.list.push(Kept::new(m));
            }
        }
    }

    pub(super) fn clear(&mut self) {
        self.list.clear();
        self.at.clear();
    }

    pub(super) fn get(&self, id: &str) -> Option<&Kept> {
        self.at.get(id).map(|&i| &self.list[i])
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, Kept> {
        self.list.iter()
    }

    /// Removes the message `id`; whether it was there.
    pub(super) fn remove(&mut self, id: &str) -> bool {
        let Some(i) = self.at.remove(id) else { return false };
        self.list.remove(i);
        for k in &self.list[i..] {
            if let Some(p) = self.at.get_mut(&k.id) {
                *p -= 1;
            }
        }
        true
    }
}
