//! Byte helpers of the sled records.

pub(super) fn be<const N: usize>(v: &[u8], at: usize) -> Option<[u8; N]> {
    v.get(at..at + N)?.try_into().ok()
}
