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

#[cfg(test)]
mod tests {
    use super::Messages;
    use crate::store::StoredMessage;
    use serde_json::json;

    fn msg(id: &str, n: i64) -> StoredMessage {
        StoredMessage::new(id, &json!({ "message_id": id, "n": n }))
    }

    fn ids(m: &Messages) -> Vec<String> {
        m.iter().map(|k| k.id.clone()).collect()
    }

    #[test]
    fn the_message_index_follows_upserts_and_removals() {
        let mut m = Messages::default();
        for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
            m.upsert(&msg(id, i as i64));
        }
        m.upsert(&msg("b", 9)); // replaced where it stands
        assert_eq!(ids(&m), ["a", "b", "c", "d"]);
        assert!(m.get("b").unwrap().text.get().contains("9"));
        assert!(m.remove("b"));
        assert!(!m.remove("b"));
        assert_eq!(ids(&m), ["a", "c", "d"]);
        // Every id after the removed one still finds its own message.
        for id in ["a", "c", "d"] {
            assert_eq!(m.get(id).unwrap().id, id);
        }
        m.upsert(&msg("b", 1)); // a removed id comes back at the end
        m.upsert(&msg("d", 7));
        assert_eq!(ids(&m), ["a", "c", "d", "b"]);
        assert!(m.get("d").unwrap().text.get().contains("7"));
        m.clear();
        assert!(m.get("a").is_none() && ids(&m).is_empty());
    }
}
