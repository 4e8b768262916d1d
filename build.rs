fn main() {
    // sqlx::migrate! embeds the SQL files; without this a new migration would not trigger a rebuild.
    println!("cargo:rerun-if-changed=migrations");
}
