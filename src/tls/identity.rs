//! The client identity of a TLS client certificate: its subject common name (CN).
//!
//! An IoT Edge module identity certificate carries the module id as its CN; that is what
//! `inbound__clientAuth__clientCert__adminIdentities` lists. Only read from a certificate whose
//! chain was verified ([`super::IdentityCheck`]); this only reads a field of it. A minimal DER walk (certificate →
//! tbsCertificate → subject → each RDN's attributes) rather than a full X.509 parser: every
//! length is bounds-checked, and anything unexpected yields `None` (no identity: the
//! certificate may publish but not manage).

/// One DER element at the start of `b`: its tag, contents, and the bytes after it.
fn element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, b) = b.split_first()?;
    let (len, b) = if first < 0x80 {
        (usize::from(first), b)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let (len, rest) = b.split_at(n);
        let len = len
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
        (len, rest)
    };
    if b.len() < len {
        return None;
    }
    let (contents, rest) = b.split_at(len);
    Some((tag, contents, rest))
}

/// `element` when its tag is `tag`.
fn expect(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    match element(b)? {
        (t, contents, rest) if t == tag => Some((contents, rest)),
        _ => None,
    }
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// `[0] EXPLICIT Version`.
const VERSION: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];

/// The subject CN of a DER certificate (the last one when there are several); `None` when it
/// has none or the DER is not what a certificate looks like.
pub fn common_name(cert_der: &[u8]) -> Option<String> {
    let (cert, _) = expect(cert_der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = match element(tbs)? {
        (VERSION, _, after) => after,
        _ => tbs,
    };
    // serialNumber, signature, issuer, validity; then the subject.
    for _ in 0..4 {
        rest = element(rest)?.2;
    }
    let (mut rdns, _) = expect(rest, SEQUENCE)?;
    let mut cn = None;
    while !rdns.is_empty() {
        let (mut attributes, after) = expect(rdns, SET)?;
        rdns = after;
        while !attributes.is_empty() {
            let (attribute, after) = expect(attributes, SEQUENCE)?;
            attributes = after;
            let (oid, value) = expect(attribute, OID)?;
            if oid == COMMON_NAME {
                // UTF8String, PrintableString, IA5String: all UTF-8 compatible.
                let (tag, text, _) = element(value)?;
                if matches!(tag, 0x0c | 0x13 | 0x16) {
                    cn = Some(std::str::from_utf8(text).ok()?.to_string());
                }
            }
        }
    }
    cn
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair};

    fn cert_with(cn: Option<&str>) -> Vec<u8> {
        let mut params = CertificateParams::new(vec!["sensor.local".to_string()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Contoso");
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn reads_the_subject_common_name() {
        assert_eq!(
            common_name(&cert_with(Some("sensor"))).as_deref(),
            Some("sensor")
        );
        assert_eq!(common_name(&cert_with(None)), None);
    }

    #[test]
    fn never_panics_on_garbage_or_truncation() {
        let der = cert_with(Some("sensor"));
        for len in 0..der.len() {
            let _ = common_name(&der[..len]);
        }
        let mut flipped = der.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = common_name(&flipped);
            flipped[i] ^= 0xff;
        }
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
