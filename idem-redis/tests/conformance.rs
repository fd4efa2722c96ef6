//! RedisStore passes the whole conformance suite on a standalone server and on a
//! three-master cluster, each case under the suite's namespace as its key prefix.

mod common;

mod standalone {
    use idem_testkit::Namespace;

    idem_testkit::conformance_tests!(
        service: "IDEM_TEST_REDIS_URL",
        |url: String, namespace: Namespace| async move {
            super::common::standalone_in(&url, namespace.as_str()).await
        },
    );
}

mod cluster {
    use idem_testkit::Namespace;

    idem_testkit::conformance_tests!(
        service: "IDEM_TEST_REDIS_CLUSTER_NODES",
        |nodes: String, namespace: Namespace| async move {
            super::common::cluster_in(&nodes, namespace.as_str()).await
        },
    );
}

mod admin_standalone {
    use idem_testkit::Namespace;

    idem_testkit::admin_conformance_tests!(
        service: "IDEM_TEST_REDIS_URL",
        |url: String, namespace: Namespace| async move {
            super::common::standalone_in(&url, namespace.as_str()).await
        },
    );
}

mod admin_cluster {
    use idem_testkit::Namespace;

    idem_testkit::admin_conformance_tests!(
        service: "IDEM_TEST_REDIS_CLUSTER_NODES",
        |nodes: String, namespace: Namespace| async move {
            super::common::cluster_in(&nodes, namespace.as_str()).await
        },
    );
}
