//! RedisStore passes the whole conformance suite on a standalone server and on a
//! three-master cluster, each case under a key prefix of its own.

mod common;

fn capabilities() -> idem_testkit::Capabilities {
    // Redis deletes records itself (PEXPIREAT) the moment they are purgeable.
    idem_testkit::Capabilities::default().with_expired_records_vanishing()
}

mod standalone {
    idem_testkit::conformance_tests!(
        service: "IDEM_TEST_REDIS_URL",
        |url: String| async move { super::common::standalone(&url).await },
        super::capabilities(),
    );
}

mod cluster {
    idem_testkit::conformance_tests!(
        service: "IDEM_TEST_REDIS_CLUSTER_NODES",
        |nodes: String| async move { super::common::cluster(&nodes).await },
        super::capabilities(),
    );
}
