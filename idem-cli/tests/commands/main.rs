//! Every subcommand, end to end: the built `idem` binary against SQLite and each server
//! backend (PostgreSQL, Redis standalone and Cluster, DynamoDB Local on 127.0.0.1), with
//! the records seeded and checked through the library on the same namespace.
//!
//! - `support.rs`: a store the binary is pointed at, and one run of the binary.
//! - `backends.rs`: each backend, or none when its server is absent.
//! - `stats_and_list.rs`, `one_record.rs`, `purge.rs`: the cases run on every backend
//!   (below).
//! - `exits.rs`: runs without a backend: usage errors, what cannot be read or reached,
//!   and their exit codes.

mod backends;
mod exits;
mod one_record;
mod purge;
mod stats_and_list;
mod support;

use backends::{dynamodb, postgres, redis_cluster, redis_standalone, sqlite};
use one_record::{delete_removes_one_record, inspect_shows_one_record, release_fences_the_owner};
use purge::{purge_deletes_only_expired_records, purge_stops_at_max};
use stats_and_list::{list_filters_pages_and_hides_keys, migrate_then_stats_count_by_state};

macro_rules! every_backend {
    ($($backend:ident),* $(,)?) => {
        $(
            mod $backend {
                macro_rules! case {
                    ($case:ident) => {
                        #[test]
                        fn $case() {
                            if let Some(backend) = super::$backend() {
                                super::$case(backend);
                            }
                        }
                    };
                }
                case!(migrate_then_stats_count_by_state);
                case!(list_filters_pages_and_hides_keys);
                case!(inspect_shows_one_record);
                case!(release_fences_the_owner);
                case!(delete_removes_one_record);
                case!(purge_deletes_only_expired_records);
                case!(purge_stops_at_max);
            }
        )*
    };
}

every_backend!(sqlite, postgres, redis_standalone, redis_cluster, dynamodb);
