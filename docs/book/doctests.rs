//! The idem guide's code. This crate holds no code of its own: each page of the book
//! (`docs/book/src/`) and the workspace README are the documentation of an item below, so
//! `cargo test --doc -p idem-guide` compiles every Rust snippet in them, and runs those
//! not marked `no_run` (the ones that need a server). `tests/store_contract.rs` checks
//! that the `Store` trait's docs and the conformance suite say the same.

macro_rules! pages {
    ($($name:ident => $path:literal),* $(,)?) => {
        $(
            #[cfg(doctest)]
            #[doc = include_str!($path)]
            pub struct $name;
        )*
    };
}

pages! {
    Readme => "../../README.md",
    Introduction => "src/introduction.md",
    GettingStarted => "src/getting-started.md",
    ChoosingAStore => "src/choosing-a-store.md",
    KeysAndFingerprints => "src/keys-and-fingerprints.md",
    StepsAndSagas => "src/steps-and-sagas.md",
    Http => "src/http.md",
    Client => "src/client.md",
    Consumers => "src/consumers.md",
    Proxy => "src/proxy.md",
    Operating => "src/operating.md",
    Security => "src/security.md",
    WhatHappensWhen => "src/what-happens-when.md",
    WritingAStore => "src/writing-a-store.md",
}
