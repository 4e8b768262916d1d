//! `put_input_leased` on every backend (and through `LazyStore`): the lease and the run's input
//! commit together, and a busy, moved or foreign thread is refused with nothing written.

mod common;

use serde_json::json;
use tenxgraph::store::{
    LeaseAttempt, LeaseRequest, LeasedInput, StepWrite, StopKey, StoreError, StoredMessage, ThreadRef,
};

use common::stores::backends;

fn msg(id: &str) -> StoredMessage {
    StoredMessage::new(id, &json!({"message_id": id, "role": "user", "content": [{"type": "text", "text": id}]}))
}

fn step<'a>(expected: i64, state: &'a serde_json::Value, msgs: &'a [StoredMessage]) -> StepWrite<'a> {
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

fn req(holder: &str, user: Option<&str>) -> LeaseRequest {
    LeaseRequest {
        holder: holder.into(),
        host: "test-host".into(),
        pid: 1,
        pid_start: 1,
        ttl: std::time::Duration::from_secs(60),
        steal: None,
        user_id: user.map(str::to_owned),
        owner_scoped: false,
    }
}

const NS: &str = "stop";

fn stop(key: &str) -> Option<StopKey<'_>> {
    Some(StopKey { namespace: NS, key })
}

#[tokio::test]
async fn the_lease_the_input_and_the_stop_key_clear_commit_together() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new("th", "u");
        s.cache_put(NS, "th:u", &json!({"stop": true}), None).await.unwrap();
        let st = json!({"n": 1});
        let got =
            s.put_input_leased(&t, &req("run-1", Some("u")), step(0, &st, &[msg("m1")]), stop("th:u")).await.unwrap();
        let LeasedInput::Committed { token, version: 1 } = got else { panic!("{name}: {got:?}") };
        let lease = s.lease_get("th").await.unwrap().expect("lease row");
        assert!(token > 0 && lease.is_live() && lease.holder == "run-1" && lease.token == token, "{name}: {lease:?}");
        let cp = s.load(&t).await.unwrap().expect("input committed");
        assert_eq!((cp.version, cp.messages.len()), (1, 1), "{name}");
        assert_eq!(s.cache_get(NS, "th:u").await.unwrap(), None, "{name}: the old stop request is cleared");
        // The next step is fenced by the token the input commit took.
        let st2 = json!({"n": 2});
        let w = StepWrite { fence: Some(1), release_lease: true, ..step(1, &st2, &[]) };
        assert_eq!(s.put_step(&t, w).await.unwrap(), 2, "{name}");
        assert!(!s.lease_get("th").await.unwrap().unwrap().is_live(), "{name}: released with the last step");
        // A released lease is taken again by the next turn's input commit, with the next token.
        let st3 = json!({"n": 3});
        let again = s.put_input_leased(&t, &req("run-2", Some("u")), step(2, &st3, &[msg("m2")]), None).await.unwrap();
        assert_eq!(again, LeasedInput::Committed { token: 2, version: 3 }, "{name}");
    }
}

#[tokio::test]
async fn a_busy_thread_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new("busy", "u");
        let LeaseAttempt::Acquired { token } = s.lease_acquire("busy", &req("holder", None)).await.unwrap() else {
            panic!("{name}: the first take must succeed")
        };
        s.cache_put(NS, "busy:u", &json!({"stop": true}), None).await.unwrap();
        let st = json!({"n": 1});
        let got = s
            .put_input_leased(&t, &req("late", Some("u")), step(0, &st, &[msg("late-m")]), stop("busy:u"))
            .await
            .unwrap();
        match got {
            LeasedInput::Held(info) => assert_eq!((info.holder.as_str(), info.token), ("holder", token), "{name}"),
            other => panic!("{name}: expected Held, got {other:?}"),
        }
        assert!(s.load(&t).await.unwrap().is_none(), "{name}: no input row");
        assert!(s.get_message(&t, "late-m").await.unwrap().is_none(), "{name}: no message");
        let lease = s.lease_get("busy").await.unwrap().unwrap();
        assert_eq!((lease.holder.as_str(), lease.token), ("holder", token), "{name}: the holder's lease is untouched");
        assert!(s.cache_get(NS, "busy:u").await.unwrap().is_some(), "{name}: the stop request stays for the holder");
        // A holder found dead is taken over by naming its token, input and all.
        let steal = LeaseRequest { steal: Some(token), ..req("heir", Some("u")) };
        let got = s.put_input_leased(&t, &steal, step(0, &st, &[msg("heir-m")]), None).await.unwrap();
        let LeasedInput::Committed { token: heir, version: 1 } = got else { panic!("{name}: {got:?}") };
        assert!(heir > token, "{name}: {heir} after {token}");
    }
}

#[tokio::test]
async fn a_thread_moved_since_the_load_is_refused_and_keeps_its_lease_row() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new("moved", "u");
        // The run loaded version 0; another writer committed version 1 since.
        let other = json!({"by": "other"});
        s.put_step(&t, step(0, &other, &[msg("other-m")])).await.unwrap();
        let mine = json!({"by": "me"});
        let err =
            s.put_input_leased(&t, &req("run", Some("u")), step(0, &mine, &[msg("my-m")]), None).await.unwrap_err();
        assert!(matches!(err, StoreError::Stale { expected: 0, current: 1, .. }), "{name}: {err:?}");
        assert!(s.lease_get("moved").await.unwrap().is_none_or(|l| !l.is_live()), "{name}: no lease taken");
        let cp = s.load(&t).await.unwrap().unwrap();
        assert_eq!((cp.version, &cp.state), (1, &other), "{name}");
        assert!(
            s.get_message(&t, "my-m").await.unwrap().is_none(),
            "{name}: the refused input's message is not stored"
        );
        // And a lease row that exists is not moved by the refusal either.
        let LeaseAttempt::Acquired { token } = s.lease_acquire("moved", &req("a", None)).await.unwrap() else {
            panic!("{name}")
        };
        s.lease_release("moved", token).await.unwrap();
        let err = s.put_input_leased(&t, &req("run", Some("u")), step(0, &mine, &[]), None).await.unwrap_err();
        assert!(matches!(err, StoreError::Stale { .. }), "{name}: {err:?}");
        let lease = s.lease_get("moved").await.unwrap().unwrap();
        assert_eq!((lease.token, lease.holder.as_str(), lease.is_live()), (token, "a", false), "{name}");
    }
}

#[tokio::test]
async fn another_users_thread_is_refused_and_its_lease_row_stays() {
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, true).await {
        let alice = ThreadRef::new("owned", "alice");
        let st = json!({"n": 1});
        let got =
            s.put_input_leased(&alice, &req("a-run", Some("alice")), step(0, &st, &[msg("a-m")]), None).await.unwrap();
        assert_eq!(got, LeasedInput::Committed { token: 1, version: 1 }, "{name}");
        s.lease_release("owned", 1).await.unwrap();
        let bob = ThreadRef::new("owned", "bob");
        let err =
            s.put_input_leased(&bob, &req("b-run", Some("bob")), step(1, &st, &[msg("b-m")]), None).await.unwrap_err();
        assert!(matches!(err, StoreError::Forbidden { .. }), "{name}: {err:?}");
        let lease = s.lease_get("owned").await.unwrap().unwrap();
        assert_eq!((lease.token, lease.holder.as_str()), (1, "a-run"), "{name}: bob moved alice's lease row");
        assert_eq!(s.load(&alice).await.unwrap().unwrap().version, 1, "{name}");
    }
}

/// `put_input_on_head`: an input built on a kept commit, with no read before it. Postgres checks
/// the head itself; the other stores do not claim to and refuse, sending the run to a full read.
#[tokio::test]
async fn an_input_on_a_kept_head_commits_only_on_that_very_commit() {
    use tenxgraph::store::{set_write_mark, write_mark};
    let dir = tempfile::tempdir().unwrap();
    for (name, s) in backends(&dir, false).await {
        let t = ThreadRef::new("kept", "u");
        let mut first = json!({"n": 1});
        set_write_mark(&mut first, "mark-a");
        if !s.checks_head_at_input() {
            let e = s
                .put_input_on_head(&t, &req("run-0", Some("u")), step(0, &first, &[msg("k0")]), None)
                .await
                .unwrap_err();
            assert!(matches!(e, StoreError::Stale { .. }), "{name}: {e:?}");
            assert!(s.load(&t).await.unwrap().is_none() && s.lease_get("kept").await.unwrap().is_none(), "{name}");
            continue;
        }
        let Ok(LeasedInput::Committed { token, .. }) =
            s.put_input_leased(&t, &req("run-1", Some("u")), step(0, &first, &[msg("k1")]), None).await
        else {
            panic!("{name}: the first input commits")
        };
        s.lease_release("kept", token).await.unwrap();
        // The head is the kept commit (version 1, mark-a): committed, the lease taken with it.
        let mut second = json!({"n": 2});
        set_write_mark(&mut second, "mark-b");
        let k2 = [msg("k2")];
        let w = StepWrite { previous_mark: Some("mark-a"), ..step(1, &second, &k2) };
        let got = s.put_input_on_head(&t, &req("run-2", Some("u")), w, stop("kept:u")).await.unwrap();
        let LeasedInput::Committed { token, version: 2 } = got else { panic!("{name}: {got:?}") };
        assert!(s.lease_get("kept").await.unwrap().unwrap().is_live(), "{name}");
        s.lease_release("kept", token).await.unwrap();
        assert_eq!(write_mark(&s.load(&t).await.unwrap().unwrap().state), Some("mark-b"), "{name}");
        // Deleted and written again to version 2 under another mark: same version, another commit.
        s.clear_state(&t).await.unwrap();
        for (v, mark, seen) in [(0, "other-1", None), (1, "other-2", Some("other-1"))] {
            let mut st = json!({"n": 10 + v});
            set_write_mark(&mut st, mark);
            let m = [msg(&format!("o{v}"))];
            s.put_step(&t, StepWrite { previous_mark: seen, ..step(v, &st, &m) }).await.unwrap();
        }
        let mut third = json!({"n": 3});
        set_write_mark(&mut third, "mark-c");
        for (expected, kept_mark) in [(2, "mark-b"), (1, "mark-a"), (3, "mark-b")] {
            let k3 = [msg("k3")];
            let w = StepWrite { previous_mark: Some(kept_mark), ..step(expected, &third, &k3) };
            let e = s.put_input_on_head(&t, &req("run-3", Some("u")), w, None).await.unwrap_err();
            assert!(matches!(e, StoreError::Stale { .. }), "{name}: kept ({expected}, {kept_mark}): {e:?}");
        }
        // Refused with nothing written: the other life's head, no lease taken, no message added.
        let cp = s.load(&t).await.unwrap().unwrap();
        assert_eq!((cp.version, write_mark(&cp.state), cp.messages.len()), (2, Some("other-2"), 2), "{name}");
        assert!(!s.lease_get("kept").await.unwrap().unwrap().is_live(), "{name}: the refused take is undone");
        // A live lease is refused as by `put_input_leased`: the holder comes back, nothing written.
        let LeaseAttempt::Acquired { .. } = s.lease_acquire("kept", &req("holder", Some("u"))).await.unwrap() else {
            panic!("{name}: the lease is free")
        };
        let k4 = [msg("k4")];
        let w = StepWrite { previous_mark: Some("other-2"), ..step(2, &third, &k4) };
        let got = s.put_input_on_head(&t, &req("run-4", Some("u")), w, None).await.unwrap();
        assert!(matches!(got, LeasedInput::Held(ref info) if info.holder == "holder"), "{name}: {got:?}");
        assert_eq!(s.load(&t).await.unwrap().unwrap().version, 2, "{name}");
    }
}
