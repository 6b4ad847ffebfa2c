//! The client's IP address as a key, behind trusted proxies if any: [`ClientIp`].

use std::borrow::Cow;
use std::fmt;
use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::Extensions;
use http::request::Parts;
use overload_core::ConfigError;
use overload_signal::signal::{
    CallerKey, ClientAddr, ForwardedHeader, IpNet, TrustedProxies, peer_addr,
};

use super::extractor::{KeyExtractor, MissingKey};

type PeerFn = dyn Fn(&Extensions) -> Option<SocketAddr> + Send + Sync;

/// The client's IP address, as a rate-limit key.
///
/// # Where the peer address comes from
///
/// The connection's peer address is read from a request extension, which the server puts
/// there:
///
/// - [`ClientIp::new`] (the default) reads a [`SocketAddr`] extension
///   (`overload_signal::signal::peer_addr`): the plain contract every layer of this
///   workspace reads, whatever the framework. The overload layer's default caller key reads
///   the same, so a limit and the overload layer see one client alike. Put it there with
///   this crate's adapters: in axum 0.8, serve with
///   `ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app)` (feature
///   `axum-0_8`); in tonic 0.14, plain TCP or TLS, build the server with
///   `ratelimit_layer::tonic_0_14::server_builder()` (feature `tonic-0_14`); in any other
///   server (hyper, another major version of axum or tonic), insert the peer's `SocketAddr`
///   in each request's extensions, outside the limit.
/// - [`ClientIp::from_extension`] reads any other extension type through a function: a
///   type of your own server's, or a framework's connect info read directly.
///
/// A request without the extension has no key: the server does not provide the address,
/// which no client can cause. Such a request follows the layer's
/// [`MissingKey`] policy, by default [`Reject`](MissingKey::Reject): `500` (gRPC
/// `INTERNAL`), without calling the service, rather than one limit for every client, which
/// would let one client use up everyone's quota. The layer says why at the first such
/// request, at `ERROR`, with the fix in the message, then at most once a minute while they
/// keep coming, and `ratelimit_layer_missing_key_total` counts every one.
///
/// # Proxies
///
/// By default forwarding headers are **ignored**: anyone can send `X-Forwarded-For`, so
/// trusting it would let a client pick its own key and escape its limit.
///
/// **Behind a load balancer, trust it once, on the overload layer**
/// ([`OverloadProtectionLayerBuilder::trusted_proxies`](crate::OverloadProtectionLayerBuilder::trusted_proxies)):
/// it resolves each request's client from the header the balancer writes and leaves it in
/// the request (`overload_signal::signal::ClientAddr`), and this extractor keys by that
/// address whenever it is there. One setting, so the limit and the overload layer's caller
/// key always agree.
///
/// A limit used without the overload layer names the proxies itself with
/// [`ClientIpBuilder::trust_proxies`]: if the peer is one of them, the chosen header is read
/// from right to left (nearest proxy first), skipping trusted proxies; the first address that
/// is not a trusted proxy is the client. Only the one header you name is read, never both.
/// (A `ClientAddr` resolved outside still wins.)
///
/// # IPv6
///
/// IPv6 clients are keyed by their `/64` network by default: one host usually holds a
/// whole `/64` (RFC 6177) and could otherwise rotate addresses to escape its limit. Change
/// it with [`ClientIpBuilder::ipv6_prefix`] (`128` keys exact addresses). IPv4-mapped IPv6
/// addresses count as IPv4.
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
/// use ratelimit_layer::key::{ClientIp, ForwardedHeader};
///
/// // The defaults: the peer address from the `SocketAddr` extension, no trusted proxy,
/// // IPv6 keyed by /64.
/// let direct = ClientIp::new();
///
/// // Behind a load balancer in 10.0.0.0/8 that appends to `X-Forwarded-For`.
/// let behind_proxies = ClientIp::builder()
///     .trust_proxies(ForwardedHeader::XForwardedFor, ["10.0.0.0/8".parse()?])
///     .ipv6_prefix(56)
///     .build()?;
/// # let _ = (direct, behind_proxies);
/// # Ok::<(), ratelimit_layer::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ClientIp {
    peer: Arc<PeerFn>,
    proxies: Option<TrustedProxies>,
    ipv6_prefix: u8,
}

impl ClientIp {
    /// The default IPv6 key prefix: `/64`, because RFC 6177 assigns a `/64` or more per
    /// site, so one host can hold a whole `/64`.
    pub const DEFAULT_IPV6_PREFIX: u8 = 64;

    /// Reads the peer address from the [`SocketAddr`] extension the server put in the
    /// request (see [where the peer address comes from](ClientIp#where-the-peer-address-comes-from));
    /// no trusted proxies; IPv6 keyed by `/64`.
    pub fn new() -> Self {
        Self {
            peer: Arc::new(peer_addr),
            proxies: None,
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
    }

    /// Reads the peer address from a request extension of type `T` through `peer`; no
    /// trusted proxies; IPv6 keyed by `/64`.
    pub fn from_extension<T, F>(peer: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Option<SocketAddr> + Send + Sync + 'static,
    {
        Self {
            peer: Arc::new(move |ext: &Extensions| ext.get::<T>().and_then(&peer)),
            proxies: None,
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
    }

    /// A builder starting from the defaults of [`new`](Self::new).
    pub fn builder() -> ClientIpBuilder {
        ClientIpBuilder {
            client_ip: Self::new(),
            proxies: None,
            proxies_twice: false,
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
    }

    /// The client address of a request (masked to the IPv6 prefix): the one a layer
    /// outside resolved ([`ClientAddr`], left by the overload layer with trusted proxies),
    /// or else the peer's, behind this extractor's own trusted proxies if it has any; `None`
    /// without a peer address.
    pub fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        let client = match parts.extensions.get::<ClientAddr>() {
            Some(resolved) => resolved.ip(),
            None => {
                let peer = (self.peer)(&parts.extensions)?.ip().to_canonical();
                match &self.proxies {
                    Some(proxies) => proxies.client(peer, &parts.headers),
                    None => peer,
                }
            }
        };
        Some(self.mask(client))
    }

    /// The proxies this extractor trusts on its own, if any.
    pub fn trusted_proxies(&self) -> Option<&TrustedProxies> {
        self.proxies.as_ref()
    }

    fn mask(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            // NOTE: the prefix was checked (at most 128) when the extractor was built.
            IpAddr::V6(_) => IpNet::new(ip, self.ipv6_prefix).map_or(ip, |net| net.addr()),
        }
    }
}

impl Default for ClientIp {
    /// The same as [`ClientIp::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIp")
            .field("proxies", &self.proxies)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}

impl KeyExtractor for ClientIp {
    type Key = IpAddr;
    type Lookup = IpAddr;

    #[inline]
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, IpAddr>> {
        self.client_ip(parts).map(Cow::Owned)
    }

    /// [`MissingKey::Reject`]: every connection has a peer, so a request without one comes
    /// from a server that does not put it in the request's extensions.
    fn missing_key(&self) -> MissingKey {
        MissingKey::Reject
    }

    /// The address this extractor keys by ([`client_ip`](Self::client_ip)), behind its own
    /// trusted proxies too.
    fn client_addr(&self, parts: &Parts) -> Option<IpAddr> {
        self.client_ip(parts)
    }
}

/// The overload layer tells callers apart by the same address as the limit (with the same
/// trusted proxies), and, as its default key does, by that address's network: an IPv4 `/24`,
/// an IPv6 `/48` ([`PeerIp::network`](overload_signal::signal::PeerIp::network)), so a
/// handful of addresses of one network is one caller there, while the limit keeps a quota
/// per address.
impl CallerKey for ClientIp {
    fn hash_key(&self, parts: &Parts, state: &mut dyn Hasher) -> bool {
        match self.client_ip(parts) {
            Some(ip) => {
                state.write_u128(overload_signal::signal::PeerIp::network_word(ip));
                true
            }
            None => false,
        }
    }
}

/// Builds a [`ClientIp`]; from [`ClientIp::builder`].
#[must_use]
pub struct ClientIpBuilder {
    client_ip: ClientIp,
    /// The proxies as set, checked by `build`.
    proxies: Option<ProxySetting>,
    /// Whether both `trust_proxies` and `trusted_proxies` were called.
    proxies_twice: bool,
    ipv6_prefix: u8,
}

impl ClientIpBuilder {
    /// Reads the peer address from a request extension of type `T` through `peer`.
    /// Default: the [`SocketAddr`] extension (see [`ClientIp`]).
    pub fn peer_from_extension<T, F>(mut self, peer: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Option<SocketAddr> + Send + Sync + 'static,
    {
        self.client_ip.peer = ClientIp::from_extension(peer).peer;
        self
    }

    /// Trusts `proxies`: when the peer is one of them, the client address is read from
    /// `header` (see `overload_signal::signal::TrustedProxies` for the rules). Default:
    /// nobody is trusted, and forwarding headers are ignored.
    ///
    /// For a limit used **without** the overload layer. Behind `OverloadProtectionLayer` (or
    /// `OverloadSignalLayer`), set the proxies there instead
    /// ([`OverloadProtectionLayerBuilder::trusted_proxies`](crate::OverloadProtectionLayerBuilder::trusted_proxies)):
    /// it resolves the client for the whole stack, and this extractor uses what it resolved,
    /// so the limit and the overload layer cannot disagree.
    ///
    /// The same setting as [`trusted_proxies`](Self::trusted_proxies), unchecked until
    /// [`build`](Self::build); call one of the two.
    pub fn trust_proxies(
        mut self,
        header: ForwardedHeader,
        proxies: impl IntoIterator<Item = IpNet>,
    ) -> Self {
        self.proxies_twice |= matches!(self.proxies, Some(ProxySetting::Checked(_)));
        self.proxies = Some(ProxySetting::Unchecked(
            header,
            proxies.into_iter().collect(),
        ));
        self
    }

    /// Trusts `proxies`, already validated: the same setting the overload layer takes
    /// ([`OverloadSignalLayerBuilder::trusted_proxies`](overload_signal::OverloadSignalLayerBuilder::trusted_proxies)),
    /// for a limit used without it; read back with [`ClientIp::trusted_proxies`]. Default:
    /// nobody is trusted. Not together with [`trust_proxies`](Self::trust_proxies).
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies_twice |= matches!(self.proxies, Some(ProxySetting::Unchecked(..)));
        self.proxies = Some(ProxySetting::Checked(proxies));
        self
    }

    /// Keys IPv6 clients by their first `bits` bits (`128` keys exact addresses).
    /// Default: 64 ([`ClientIp::DEFAULT_IPV6_PREFIX`]).
    pub const fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Builds the extractor.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`]: an `ipv6_prefix` above 128 (kind `OutOfRange`); trusted proxies
    /// that name no network, or a network of prefix 0, which would trust every client (on
    /// `proxies`; see `TrustedProxies::new`); both `trust_proxies` and `trusted_proxies`
    /// called (kind `Conflict`).
    pub fn build(self) -> Result<ClientIp, ConfigError> {
        if self.proxies_twice {
            return Err(ConfigError::conflict(
                "trusted_proxies",
                "trust_proxies and trusted_proxies set the same proxies: call one",
            ));
        }
        if self.ipv6_prefix > 128 {
            return Err(ConfigError::out_of_range(
                "ipv6_prefix",
                self.ipv6_prefix,
                "at most 128",
            ));
        }
        let proxies = self
            .proxies
            .map(|setting| match setting {
                ProxySetting::Checked(proxies) => Ok(proxies),
                ProxySetting::Unchecked(header, nets) => TrustedProxies::new(header, nets),
            })
            .transpose()?;
        Ok(ClientIp {
            proxies,
            ipv6_prefix: self.ipv6_prefix,
            ..self.client_ip
        })
    }
}

/// The proxies a builder was given: validated already, or to be checked by `build`.
#[derive(Debug)]
enum ProxySetting {
    Checked(TrustedProxies),
    Unchecked(ForwardedHeader, Vec<IpNet>),
}

impl fmt::Debug for ClientIpBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIpBuilder")
            .field("proxies", &self.proxies)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}
