//! The pool a URL opens pings a connection only after it sat idle: one the server dropped
//! meanwhile is replaced before a store call uses it, and a call in steady use costs no
//! extra round trip.

mod common;

use std::time::Duration;

use idem_core::connect::{ConnectOptions, Create, Location};
use idem_core::{Key, Store};
use idem_postgres::PostgresLocation;
use idem_postgres::sqlx::{self, Connection};
use idem_testkit::Namespace;

#[tokio::test]
async fn a_connection_the_server_dropped_while_idle_is_replaced_before_a_call() {
    let Some(url) = common::url() else {
        return;
    };
    let application = format!("idem-idle-{}", std::process::id());
    let separator = if url.contains('?') { '&' } else { '?' };
    let tagged = format!("{url}{separator}application_name={application}");
    let table = Namespace::fresh();
    let options = ConnectOptions::default().table(table.as_str());
    let location = PostgresLocation::parse(&tagged, &options).unwrap();
    location.migrate().await.expect("migrate");
    let store = location.open(Create::No).await.expect("open");
    let key = Key::new("idle", "k").unwrap();
    // The pool's connections, opened and back in the pool.
    assert!(store.get(&key).await.expect("a first call").is_none());

    // The server ends them while they sit idle (a restart, an idle timeout).
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&application)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(
        !ended.is_empty() && ended.iter().all(|&ended| ended),
        "{ended:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Called on the store itself, where nothing retries: the pool found the dead
    // connection before handing it out.
    assert!(
        store
            .get(&key)
            .await
            .expect("a call after the idle connections were dropped")
            .is_none()
    );
    let _ = admin.close().await;
}
