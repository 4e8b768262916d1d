//! Shared by the integration tests: where the PostgreSQL cases get their database.

use std::io::Write;
use std::sync::Once;

/// Set by `scripts/test.sh` (and so by CI) once it has started a throwaway PostgreSQL: from then
/// on a missing `TENXGRAPH_TEST_PG_DSN` is a failure, not a skip.
const REQUIRE_ENV: &str = "TENXGRAPH_REQUIRE_PG";

static SKIP_NOTE: Once = Once::new();

/// The test database's DSN, or None when the PostgreSQL cases are to be skipped. A skip says so on
/// stderr (once per test binary, written past libtest's output capture so `cargo test` shows it);
/// under `TENXGRAPH_REQUIRE_PG=1` there is no skip: the test panics.
pub fn pg_dsn() -> Option<String> {
    match std::env::var("TENXGRAPH_TEST_PG_DSN") {
        Ok(dsn) if !dsn.is_empty() => Some(dsn),
        _ if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") => panic!(
            "{REQUIRE_ENV}=1 but TENXGRAPH_TEST_PG_DSN is not set: the PostgreSQL cases cannot run"
        ),
        _ => {
            SKIP_NOTE.call_once(|| {
                let exe = std::env::args().next().unwrap_or_default();
                let name = std::path::Path::new(&exe).file_name().map(|n| n.to_string_lossy().into_owned());
                let _ = writeln!(
                    std::io::stderr(),
                    "note: {}: PostgreSQL cases SKIPPED (TENXGRAPH_TEST_PG_DSN is not set; scripts/test.sh starts a throwaway server)",
                    name.unwrap_or_default()
                );
            });
            None
        }
    }
}
