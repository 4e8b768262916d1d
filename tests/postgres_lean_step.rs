//! Schema version 9 on PostgreSQL (migrations/postgres/0009_lean_step_and_input.sql): a run's
//! input commit is one plpgsql call with no nested ones, every way of taking the lease still
//! works through its inlined take, a refused input step still undoes the take, and the input
//! commit writes exactly the rows a fenced `tenx_put_step` writes for the same step.
#![allow(clippy::type_complexity)] // rows read back as tuples, compared whole

mod common;

use serde_json::{Value, json};
use tenxgraph::store::{
    Checkpointer, LeaseAttempt, LeaseRequest, LeasedInput, PgOptions, PgStore, StepWrite, StoreError, StoredMessage,
    ThreadRef,
};

async fn pg() -> Option<(PgStore, String)> {
    let dsn = common::pg_dsn()?;
    let schema = format!("lean_{}", uuid::Uuid::new_v4().simple());
    let opts = PgOptions { schema: schema.clone(), enforce_user_isolation: true, ..PgOptions::default() };
    Some((PgStore::connect(&dsn, None, opts).await.expect("connect to the test Postgres"), schema))
}

fn msg(id: &str, role: &str) -> StoredMessage {
    StoredMessage::new(
        id,
        &json!({"message_id": id, "role": role, "content": [{"type": "text", "text": id}], "metadata": {"k": 1}, "usages": {"t": 2}}),
    )
}

fn step<'a>(expected: i64, state: &'a Value, msgs: &'a [StoredMessage]) -> StepWrite<'a> {
    let (state_text, mark) = common::state_text(state);
    StepWrite {
        expected_version: expected,
        state: state_text,
        mark,
        new_messages: msgs,
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
        expected_mark: None,
    }
}

fn req(holder: &str, ttl: std::time::Duration) -> LeaseRequest {
    LeaseRequest {
        holder: holder.into(),
        host: "h".into(),
        pid: 7,
        pid_start: 8,
        ttl,
        steal: None,
        user_id: Some("u".into()),
        owner_scoped: false,
    }
}

const MINUTE: std::time::Duration = std::time::Duration::from_secs(60);

/// The plpgsql functions one statement ran, with their call counts (`track_functions = 'pl'` for
/// its transaction only). The backend's counts not yet flushed include earlier transactions', so
/// the statement's are the difference of two reads around it.
async fn functions_called(s: &PgStore, schema: &str, sql: &str) -> Vec<(String, i64)> {
    let counts = "SELECT funcname::text, calls FROM pg_stat_xact_user_functions WHERE schemaname = $1";
    let mut tx = s.pool().begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL track_functions = 'pl'").execute(&mut *tx).await.unwrap();
    let before: std::collections::HashMap<String, i64> =
        sqlx::query_as(counts).bind(schema).fetch_all(&mut *tx).await.unwrap().into_iter().collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut *tx).await.unwrap();
    let after: Vec<(String, i64)> = sqlx::query_as(counts).bind(schema).fetch_all(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    let mut ran: Vec<(String, i64)> = after
        .into_iter()
        .map(|(f, n)| {
            let was = before.get(&f).copied().unwrap_or(0);
            (f, n - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    ran.sort();
    ran
}

/// Each nested plpgsql call cost 25-40 us of server time per commit; version 8's input commit
/// made two (the lease take and the step), version 9's makes none, and a step none.
#[tokio::test]
async fn the_input_commit_and_a_step_are_one_plpgsql_call_each() {
    let Some((s, schema)) = pg().await else { return };
    let state = r#"'{"execution_meta": {"status": "running"}}'::jsonb"#;
    let msgs = r#"'[{"message_id": "fc-m1", "role": "user", "content": []}]'::jsonb"#;
    let input = format!(
        "SELECT * FROM \"{schema}\".tenx_put_input('fc', 'u', 0, {state}, {msgs}, false, 20, true, NULL, \
         'run', 'h', 1, 1, 60, NULL, NULL, NULL)"
    );
    // A thread's first commit also fires 0010's trigger that names the new thread (once per
    // thread, not per commit).
    assert_eq!(
        functions_called(&s, &schema, &input).await,
        vec![("tenx_name_thread".to_owned(), 1), ("tenx_put_input".to_owned(), 1)]
    );
    // The thread committed for real now, so a fenced step has a lease to check.
    let st = json!({"execution_meta": {"status": "running"}});
    let LeasedInput::Committed { token, .. } =
        s.put_input_leased(&ThreadRef::new("fc", "u"), &req("run", MINUTE), step(0, &st, &[]), None).await.unwrap()
    else {
        panic!("the first take must succeed")
    };
    let put = format!(
        "SELECT \"{schema}\".tenx_put_step('fc', 'u', 1, {state}, '[]'::jsonb, false, 20, true, {token}, true, NULL)"
    );
    assert_eq!(functions_called(&s, &schema, &put).await, vec![("tenx_put_step".to_owned(), 1)]);
}

/// The inlined take, path by path: a thread's first take (no lease row yet), a released row, an
/// expired row, a live row (refused, nothing written, the holder reported), a live row named by
/// its token (stolen).
#[tokio::test]
async fn every_way_of_taking_the_lease_works_in_the_input_commit() {
    let Some((s, _)) = pg().await else { return };
    let t = ThreadRef::new("take", "u");
    let st = json!({"execution_meta": {"status": "running"}});
    // Tokens come from the schema's sequence (version 13): each take's is above the one before.
    let first = s.put_input_leased(&t, &req("r1", MINUTE), step(0, &st, &[msg("take-1", "user")]), None).await.unwrap();
    let LeasedInput::Committed { token: t1, version: 1 } = first else { panic!("{first:?}") };
    let lease = s.lease_get("take").await.unwrap().unwrap();
    assert!(
        lease.is_live()
            && (lease.holder.as_str(), lease.host.as_str(), lease.pid, lease.pid_start) == ("r1", "h", 7, 8)
    );

    // Live: refused, the holder reported, nothing written.
    match s.put_input_leased(&t, &req("r2", MINUTE), step(1, &st, &[msg("take-2", "user")]), None).await.unwrap() {
        LeasedInput::Held(info) => assert_eq!((info.holder.as_str(), info.token, info.released), ("r1", t1, false)),
        other => panic!("expected Held, got {other:?}"),
    }
    assert_eq!(s.load(&t).await.unwrap().unwrap().version, 1);
    assert!(s.get_message(&t, "take-2").await.unwrap().is_none());

    // Released with the run's last step: the next input takes it with the next token.
    let w = StepWrite { fence: Some(t1), release_lease: true, ..step(1, &st, &[]) };
    assert_eq!(s.put_step(&t, w).await.unwrap(), 2);
    let released =
        s.put_input_leased(&t, &req("r3", std::time::Duration::from_millis(1)), step(2, &st, &[]), None).await.unwrap();
    let LeasedInput::Committed { token: t2, version: 3 } = released else { panic!("{released:?}") };
    assert!(t2 > t1, "{t2} after {t1}");

    // Expired (a 1 ms lease, polled until the server says so): taken without naming its token.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while s.lease_get("take").await.unwrap().unwrap().is_live() {
        assert!(std::time::Instant::now() < deadline, "a 1 ms lease is still live after 30 s");
        tokio::task::yield_now().await;
    }
    let expired = s.put_input_leased(&t, &req("r4", MINUTE), step(3, &st, &[]), None).await.unwrap();
    let LeasedInput::Committed { token: t3, version: 4 } = expired else { panic!("{expired:?}") };
    assert!(t3 > t2, "{t3} after {t2}");

    // Live but named by its token: stolen.
    let steal = LeaseRequest { steal: Some(t3), ..req("r5", MINUTE) };
    let stolen = s.put_input_leased(&t, &steal, step(4, &st, &[]), None).await.unwrap();
    let LeasedInput::Committed { token: t4, version: 5 } = stolen else { panic!("{stolen:?}") };
    assert!(t4 > t3, "{t4} after {t3}");
    assert_eq!(s.lease_get("take").await.unwrap().unwrap().holder, "r5");
}

/// A step refused after the take (a message id of another thread, TX003) rolls the take back:
/// a new thread is left without a lease row, a released one keeps its row and token.
#[tokio::test]
async fn a_refused_input_step_undoes_the_take() {
    let Some((s, _)) = pg().await else { return };
    let st = json!({"execution_meta": {"status": "running"}});
    let owner = ThreadRef::new("owner", "u");
    let LeasedInput::Committed { token, .. } =
        s.put_input_leased(&owner, &req("o", MINUTE), step(0, &st, &[msg("shared", "user")]), None).await.unwrap()
    else {
        panic!("the owner's input must commit")
    };
    let w = StepWrite { fence: Some(token), release_lease: true, ..step(1, &st, &[]) };
    s.put_step(&owner, w).await.unwrap();

    let other = ThreadRef::new("other", "u");
    let err =
        s.put_input_leased(&other, &req("x", MINUTE), step(0, &st, &[msg("shared", "user")]), None).await.unwrap_err();
    assert!(matches!(err, StoreError::MessageInOtherThread { .. }), "{err:?}");
    assert!(s.lease_get("other").await.unwrap().is_none(), "the first take is undone with the step");
    assert!(s.load(&other).await.unwrap().is_none());

    let err =
        s.put_input_leased(&owner, &req("y", MINUTE), step(1, &st, &[msg("late", "user")]), None).await.unwrap_err();
    assert!(matches!(err, StoreError::Stale { .. }), "{err:?}");
    let lease = s.lease_get("owner").await.unwrap().unwrap();
    assert_eq!(
        (lease.token, lease.released, lease.holder.as_str()),
        (token, true, "o"),
        "the released row is as it was"
    );
    assert!(s.get_message(&owner, "late").await.unwrap().is_none());
}

/// The step is written out in both functions (calling one from the other is the nested call
/// version 9 removes): the same step through `tenx_put_input` and through a fenced
/// `tenx_put_step` leaves the same state row (mark kept, then dropped when the previous mark
/// does not match) and the same message columns.
#[tokio::test]
async fn the_input_commit_writes_what_a_fenced_step_writes() {
    let Some((s, schema)) = pg().await else { return };
    let marked = json!({"__state_meta__": {"write": "run-a-1"}, "execution_meta": {"status": "running"}, "n": 1});
    let remarked = json!({"__state_meta__": {"write": "run-b-2"}, "execution_meta": {"status": "running"}, "n": 2});
    let m1 = [msg("p-in-1", "user"), msg("p-in-2", "assistant")];
    let m2 = [msg("p-st-1", "user"), msg("p-st-2", "assistant")];
    let (a, b) = (ThreadRef::new("par-in", "u"), ThreadRef::new("par-st", "u"));

    // Thread a: both writes are input commits. Thread b: the same two writes as fenced steps.
    let LeasedInput::Committed { token: ta, .. } =
        s.put_input_leased(&a, &req("a", MINUTE), step(0, &marked, &m1[..1]), None).await.unwrap()
    else {
        panic!()
    };
    s.put_step(&a, StepWrite { fence: Some(ta), release_lease: true, ..step(1, &marked, &[]) }).await.unwrap();
    let second = StepWrite { previous_mark: Some("stale-mark"), ..step(2, &remarked, &m1[1..]) };
    assert!(matches!(
        s.put_input_leased(&a, &req("a2", MINUTE), second, None).await.unwrap(),
        LeasedInput::Committed { version: 3, .. }
    ));

    let LeaseAttempt::Acquired { token: tb } = s.lease_acquire("par-st", &req("b", MINUTE)).await.unwrap() else {
        panic!()
    };
    s.put_step(&b, StepWrite { fence: Some(tb), ..step(0, &marked, &m2[..1]) }).await.unwrap();
    s.put_step(&b, StepWrite { fence: Some(tb), ..step(1, &marked, &[]) }).await.unwrap();
    s.put_step(&b, StepWrite { fence: Some(tb), previous_mark: Some("stale-mark"), ..step(2, &remarked, &m2[1..]) })
        .await
        .unwrap();

    let rows = |thread: &'static str| {
        let pool = s.pool().clone();
        let schema = schema.clone();
        async move {
            let states: Vec<(i64, Value)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT version, state_data FROM \"{schema}\".states WHERE thread_id = $1 ORDER BY version"
            )))
            .bind(thread)
            .fetch_all(&pool)
            .await
            .unwrap();
            let msgs: Vec<(String, Option<String>, Option<Value>, Value, Value, Value)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT role::text, content, tool_calls, usages, meta, message_data - 'message_id' FROM \"{schema}\".messages \
                 WHERE thread_id = $1 ORDER BY seq"
            )))
            .bind(thread)
            .fetch_all(&pool)
            .await
            .unwrap();
            (states, msgs)
        }
    };
    let (sa, ma) = rows("par-in").await;
    let (sb, mb) = rows("par-st").await;
    assert_eq!(sa, sb);
    assert_eq!(sa[0].1["__state_meta__"]["write"], "run-a-1", "the first write keeps its mark");
    assert!(sa[2].1["__state_meta__"].get("write").is_none(), "a previous mark that does not match drops the mark");
    assert_eq!(ma.len(), 2);
    let strip = |m: &[(String, Option<String>, Option<Value>, Value, Value, Value)]| -> Vec<_> {
        m.iter()
            .map(|(r, c, t, u, me, d)| {
                (
                    r.clone(),
                    c.as_ref().map(|c| c.replace("p-in", "p-st")),
                    t.clone(),
                    u.clone(),
                    me.clone(),
                    d.to_string().replace("p-in", "p-st"),
                )
            })
            .collect()
    };
    assert_eq!(strip(&ma), strip(&mb));
}

/// `lease_and_load` (one statement on PostgreSQL) answers what `lease_get` and `load_with` answer
/// apart: no lease row / a live one / a released one, no state / a state / the head the caller
/// holds (messages not read), and another user's thread under isolation (no state, the lease row
/// all the same, as `lease_get` reads it).
#[tokio::test]
async fn the_start_read_answers_what_the_two_reads_answer() {
    use tenxgraph::store::KnownHead;
    let Some((s, _)) = pg().await else { return };
    let same = |a: &(
        Result<Option<tenxgraph::store::LeaseInfo>, StoreError>,
        Result<Option<tenxgraph::store::Checkpoint>, StoreError>,
    ),
                b: &(Option<tenxgraph::store::LeaseInfo>, Option<tenxgraph::store::Checkpoint>)| {
        let lease = a.0.as_ref().unwrap();
        assert_eq!(
            lease.as_ref().map(|l| (l.token, l.holder.clone(), l.released, l.is_live())),
            b.0.as_ref().map(|l| (l.token, l.holder.clone(), l.released, l.is_live()))
        );
        let cp = a.1.as_ref().unwrap();
        assert_eq!(
            cp.as_ref().map(|c| (
                c.version,
                c.state.clone(),
                c.messages.iter().map(|m| m.get().to_owned()).collect::<Vec<_>>(),
                c.messages_known
            )),
            b.1.as_ref().map(|c| (
                c.version,
                c.state.clone(),
                c.messages.iter().map(|m| m.get().to_owned()).collect::<Vec<_>>(),
                c.messages_known
            ))
        );
    };
    let t = ThreadRef::new("start", "u");
    let apart = |known: Option<KnownHead<'static>>| {
        let (s, t) = (&s, &t);
        async move { (s.lease_get(&t.thread_id).await.unwrap(), s.load_with(t, known).await.unwrap()) }
    };
    let nothing = s.lease_and_load(&t, None).await;
    assert!(matches!(nothing, (Ok(None), Ok(None))));
    same(&nothing, &apart(None).await);

    let marked = json!({"__state_meta__": {"write": "mark-1"}, "execution_meta": {"status": "running"}});
    let LeasedInput::Committed { token, .. } =
        s.put_input_leased(&t, &req("r", MINUTE), step(0, &marked, &[msg("start-1", "user")]), None).await.unwrap()
    else {
        panic!()
    };
    let live = s.lease_and_load(&t, None).await;
    assert!(live.0.as_ref().unwrap().as_ref().unwrap().is_live());
    assert_eq!(live.1.as_ref().unwrap().as_ref().unwrap().messages.len(), 1);
    same(&live, &apart(None).await);

    s.put_step(
        &t,
        StepWrite {
            fence: Some(token),
            release_lease: true,
            previous_mark: Some("mark-1"),
            ..step(1, &marked, &[msg("start-2", "assistant")])
        },
    )
    .await
    .unwrap();
    let head = KnownHead { version: 2, mark: "mark-1" };
    let known = s.lease_and_load(&t, Some(head)).await;
    let cp = known.1.as_ref().unwrap().as_ref().unwrap();
    assert!(cp.messages_known && cp.messages.is_empty() && cp.version == 2, "the held head: messages not read");
    assert!(known.0.as_ref().unwrap().as_ref().unwrap().released);
    same(&known, &apart(Some(head)).await);
    let stale_head = KnownHead { version: 1, mark: "mark-1" };
    let full = s.lease_and_load(&t, Some(stale_head)).await;
    assert_eq!(full.1.as_ref().unwrap().as_ref().unwrap().messages.len(), 2);
    same(&full, &apart(Some(stale_head)).await);

    // Another user's thread under isolation: nothing loads, the lease row reads as it is.
    let stranger = ThreadRef::new("start", "someone-else");
    let theirs = s.lease_and_load(&stranger, None).await;
    assert!(theirs.1.as_ref().unwrap().is_none());
    assert_eq!(theirs.0.as_ref().unwrap().as_ref().map(|l| l.token), Some(token));
    let apart_theirs = (s.lease_get("start").await.unwrap(), s.load_with(&stranger, None).await.unwrap());
    same(&theirs, &apart_theirs);
}
