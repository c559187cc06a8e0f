//! Checksums (tree blocks, superblocks, data) and the name/back-reference hashes.

/// Checksum algorithm of a filesystem (superblock csum_type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsumType {
    /// CRC32C (type 0, 4 bytes).
    Crc32c,
    /// xxHash64 (type 1, 8 bytes).
    Xxhash64,
    /// SHA-256 (type 2, 32 bytes).
    Sha256,
    /// BLAKE2b-256 (type 3, 32 bytes).
    Blake2b,
}

impl CsumType {
    /// The type for an on-disk csum_type value.
    pub fn from_u16(v: u16) -> Option<CsumType> {
        Some(match v {
            0 => CsumType::Crc32c,
            1 => CsumType::Xxhash64,
            2 => CsumType::Sha256,
            3 => CsumType::Blake2b,
            _ => return None,
        })
    }
    /// The on-disk csum_type value.
    pub fn as_u16(self) -> u16 {
        match self {
            CsumType::Crc32c => 0,
            CsumType::Xxhash64 => 1,
            CsumType::Sha256 => 2,
            CsumType::Blake2b => 3,
        }
    }
    /// Bytes of the checksum actually used in the 32-byte field.
    pub fn size(self) -> usize {
        match self {
            CsumType::Crc32c => 4,
            CsumType::Xxhash64 => 8,
            CsumType::Sha256 | CsumType::Blake2b => 32,
        }
    }
    /// Name as btrfs-progs prints it.
    pub fn name(self) -> &'static str {
        match self {
            CsumType::Crc32c => "crc32c",
            CsumType::Xxhash64 => "xxhash64",
            CsumType::Sha256 => "sha256",
            CsumType::Blake2b => "blake2b",
        }
    }
    /// The type for a name as `mkfs.btrfs --csum` accepts it.
    pub fn from_name(s: &str) -> Option<CsumType> {
        Some(match s {
            "crc32c" => CsumType::Crc32c,
            "xxhash" | "xxhash64" => CsumType::Xxhash64,
            "sha256" => CsumType::Sha256,
            "blake2" | "blake2b" => CsumType::Blake2b,
            _ => return None,
        })
    }
    /// Checksum of `data`, left-aligned in a zeroed 32-byte buffer.
    pub fn compute(self, data: &[u8]) -> [u8; 32] {
        let mut out = [0u8; 32];
        match self {
            CsumType::Crc32c => out[..4].copy_from_slice(&crc32c::crc32c(data).to_le_bytes()),
            CsumType::Xxhash64 => {
                out[..8].copy_from_slice(&xxhash_rust::xxh64::xxh64(data, 0).to_le_bytes())
            }
            CsumType::Sha256 => {
                use sha2::Digest;
                out.copy_from_slice(&sha2::Sha256::digest(data));
            }
            CsumType::Blake2b => {
                use blake2::Digest;
                let mut h = blake2::Blake2b::<blake2::digest::consts::U32>::new();
                h.update(data);
                out.copy_from_slice(&h.finalize());
            }
        }
        out
    }
}

/// crc32c without the customary pre- and post-inversion: the register starts at `seed`
/// and is returned as is. This is what the kernel's `crc32c()` helper computes.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// The 64-bit xxHash (seed 0) of `bytes` as a number: a fast fingerprint for
/// in-memory matching (names in `check`, block signatures in `dedupe`); the same
/// function as the Xxhash64 checksum.
#[inline]
pub fn xxh64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(bytes, 0)
}

/// Hash of a directory entry or xattr name (DIR_ITEM / XATTR_ITEM key offset).
pub fn name_hash(name: &[u8]) -> u64 {
    crc32c_raw(!1u32, name) as u64
}

/// INODE_EXTREF key offset: the name hashed with the parent inode number as seed.
pub fn extref_hash(parent_ino: u64, name: &[u8]) -> u64 {
    crc32c_raw(parent_ino as u32, name) as u64
}

/// EXTENT_DATA_REF key offset for (root, inode, file offset).
pub fn extent_data_ref_hash(root: u64, ino: u64, offset: u64) -> u64 {
    let high = crc32c_raw(!0, &root.to_le_bytes());
    let low = crc32c_raw(!0, &ino.to_le_bytes());
    let low = crc32c_raw(low, &offset.to_le_bytes());
    ((high as u64) << 31) ^ (low as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn known_values() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(name_hash(b"default"), 2378154706);
        let c = CsumType::Crc32c.compute(b"123456789");
        assert_eq!(&c[..4], &0xE306_9283u32.to_le_bytes());
        assert!(c[4..].iter().all(|&b| b == 0));
    }
    #[test]
    fn sizes() {
        for t in [
            CsumType::Crc32c,
            CsumType::Xxhash64,
            CsumType::Sha256,
            CsumType::Blake2b,
        ] {
            assert_eq!(CsumType::from_u16(t.as_u16()), Some(t));
            let c = t.compute(b"abc");
            assert!(c[t.size()..].iter().all(|&b| b == 0));
        }
    }
}
