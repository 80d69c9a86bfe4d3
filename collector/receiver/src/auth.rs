//! Bearer-token authentication of ingest streams.
//!
//! Owns: the token the collector expects ([`BearerToken`]) and the check of
//! a stream call's `authorization: Bearer <token>` metadata against it.
//!
//! Invariants:
//! - The token is never printed: its `Debug` is redacted and no error or
//!   status carries it.
//! - The presented token is compared with the expected one in time that does
//!   not depend on their contents (`subtle`). Only whether the two lengths
//!   are equal can be told by timing, so the token should be long and random
//!   (e.g. `openssl rand -hex 32`), which makes its length worthless.
//! - No `authorization` metadata, or one whose scheme is not `Bearer`, is
//!   [`AuthFailure::Missing`]; a bearer token that does not match is
//!   [`AuthFailure::Invalid`]. Both answer `UNAUTHENTICATED`.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq as _;
use tonic::Status;
use tonic::metadata::MetadataMap;

/// The metadata key the token travels in.
pub const AUTHORIZATION: &str = "authorization";

/// The token shims must present. Cheap to clone.
#[derive(Clone)]
pub struct BearerToken(Arc<[u8]>);

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// Why a text is not a usable token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    /// Nothing but whitespace.
    Empty,
    /// A character outside visible ASCII (`!` … `~`): it could not travel in
    /// an HTTP/2 header as is.
    InvalidCharacter,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenError::Empty => "the token is empty",
            TokenError::InvalidCharacter => {
                "the token has a character outside visible ASCII (no spaces or control characters)"
            }
        })
    }
}

impl std::error::Error for TokenError {}

/// Why a stream call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `authorization: Bearer …` metadata.
    Missing,
    /// A bearer token that is not the expected one.
    Invalid,
}

impl AuthFailure {
    /// The status message.
    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing bearer token",
            AuthFailure::Invalid => "invalid bearer token",
        }
    }

    /// The `UNAUTHENTICATED` status the call is answered with.
    pub fn status(self) -> Status {
        Status::unauthenticated(self.message())
    }
}

impl BearerToken {
    /// A token from its text, surrounding whitespace (a file's final
    /// newline) trimmed.
    pub fn new(text: &str) -> Result<BearerToken, TokenError> {
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty);
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::InvalidCharacter);
        }
        Ok(BearerToken(token.as_bytes().into()))
    }

    /// Checks the `authorization` metadata of a call.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), AuthFailure> {
        let presented = metadata
            .get(AUTHORIZATION)
            .and_then(|value| bearer_credentials(value.as_bytes()))
            .ok_or(AuthFailure::Missing)?;
        if bool::from(self.0.as_ref().ct_eq(presented)) {
            Ok(())
        } else {
            Err(AuthFailure::Invalid)
        }
    }
}

/// The credentials of a `Bearer <credentials>` header value (scheme matched
/// case-insensitively, as RFC 9110 says), or None for another scheme.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) || rest.first() != Some(&b' ') {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    let end = rest
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(start, |i| i + 1);
    rest.get(start..end.max(start))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tonic::metadata::MetadataValue;

    fn metadata(value: Option<&str>) -> MetadataMap {
        let mut map = MetadataMap::new();
        if let Some(value) = value {
            map.insert(AUTHORIZATION, MetadataValue::try_from(value).unwrap());
        }
        map
    }

    #[test]
    fn tokens_are_trimmed_and_checked() {
        assert!(BearerToken::new("  s3cret\n").is_ok());
        assert_eq!(BearerToken::new(" \n").unwrap_err(), TokenError::Empty);
        assert_eq!(
            BearerToken::new("two words").unwrap_err(),
            TokenError::InvalidCharacter
        );
        assert_eq!(
            BearerToken::new("caf\u{e9}").unwrap_err(),
            TokenError::InvalidCharacter
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let token = BearerToken::new("s3cret").unwrap();
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn checks_the_authorization_metadata() {
        let token = BearerToken::new("s3cret").unwrap();
        assert_eq!(token.check(&metadata(Some("Bearer s3cret"))), Ok(()));
        assert_eq!(token.check(&metadata(Some("bearer   s3cret "))), Ok(()));
        assert_eq!(token.check(&metadata(Some("BEARER s3cret"))), Ok(()));
        assert_eq!(
            token.check(&metadata(None)),
            Err(AuthFailure::Missing),
            "no header"
        );
        assert_eq!(
            token.check(&metadata(Some("Basic czNjcmV0"))),
            Err(AuthFailure::Missing),
            "another scheme"
        );
        assert_eq!(
            token.check(&metadata(Some("Bearers3cret"))),
            Err(AuthFailure::Missing)
        );
        for wrong in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Bearer S3CRET",
            "Bearer ",
            "Bearer x",
        ] {
            assert_eq!(
                token.check(&metadata(Some(wrong))),
                Err(AuthFailure::Invalid),
                "{wrong}"
            );
        }
    }

    #[test]
    fn failures_answer_unauthenticated() {
        let status = AuthFailure::Missing.status();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(status.message(), "missing bearer token");
        assert_eq!(
            AuthFailure::Invalid.status().message(),
            "invalid bearer token"
        );
    }
}
