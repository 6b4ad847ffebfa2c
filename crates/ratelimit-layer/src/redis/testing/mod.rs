//! Throwaway Redis deployments for tests, on 127.0.0.1: a `redis-server`
//! ([`RedisServer`], plain or with TLS), a Redis Cluster ([`RedisCluster`]), and a TCP
//! proxy that can black-hole its connections ([`BlackHoleProxy`]). Only with the features
//! `redis` and `test-util`.
//!
//! ```no_run
//! use ratelimit_layer::redis::RedisStore;
//! use ratelimit_layer::redis::testing::RedisServer;
//!
//! let server = RedisServer::start();
//! let store = RedisStore::new(&server.url()).unwrap();
//! // ... the server is killed, and its directory removed, when `server` is dropped.
//! ```

mod cluster;
mod process;
mod proxy;
mod server;

pub use cluster::RedisCluster;
pub use proxy::BlackHoleProxy;
pub use server::{INSTALL_HINT, RedisServer};
