//! Shared by the integration tests: where the PostgreSQL cases get their database.

pub mod stores;

use std::collections::HashSet;
use std::io::Write;
use std::sync::Mutex;

/// Set by `scripts/test.sh` (and so by CI) once it has started a throwaway PostgreSQL: from then
/// on a missing `TENXGRAPH_TEST_PG_DSN` is a failure, not a skip.
const REQUIRE_ENV: &str = "TENXGRAPH_REQUIRE_PG";

/// Tests that already said they skip (a test may ask for a database more than once).
static SKIPPED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// The test database's DSN, or None when the PostgreSQL cases are to be skipped. Each test that
/// skips says so on stderr, once, by name (written past libtest's output capture so `cargo test`
/// shows it); under `TENXGRAPH_REQUIRE_PG=1` there is no skip: the test panics. A DSN that is set
/// but unreachable fails the test where it connects, with or without the variable.
pub fn pg_dsn() -> Option<String> {
    match std::env::var("TENXGRAPH_TEST_PG_DSN") {
        Ok(dsn) if !dsn.is_empty() => Some(dsn),
        _ if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") => {
            panic!("{REQUIRE_ENV}=1 but TENXGRAPH_TEST_PG_DSN is not set: the PostgreSQL cases cannot run")
        }
        _ => {
            // libtest runs each test on a thread named after it.
            let test = std::thread::current().name().unwrap_or("?").to_owned();
            let mut seen = SKIPPED.lock().unwrap_or_else(|p| p.into_inner());
            if seen.get_or_insert_with(HashSet::new).insert(test.clone()) {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED {test}: its PostgreSQL cases did not run (TENXGRAPH_TEST_PG_DSN is not set; scripts/test.sh starts a throwaway server)"
                );
            }
            None
        }
    }
}

/// A state as a step writes it: its text and the write mark inside it. Leaked: a test writes a
/// few rows, and `StepWrite` borrows them.
#[allow(dead_code)] // not every test binary writes steps
pub fn state_text(v: &serde_json::Value) -> (&'static tenxgraph::store::SharedJson, Option<&'static str>) {
    let (text, mark) = tenxgraph::store::state_row(v);
    (Box::leak(Box::new(text)), mark.map(|m| &*Box::leak(m.into_boxed_str())))
}
