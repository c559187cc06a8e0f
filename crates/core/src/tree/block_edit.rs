//! Mutable tree-block byte operations (the kernel's extent_buffer accessors): leaf item
//! insertion and deletion with one memmove of the packed data area, item resize, node
//! pointer insertion and deletion, and bulk moves of contiguous items between siblings
//! with a single copy of their headers and a single copy of their data (seed 004).
//!
//! Leaf layout: header (101 bytes) | item headers growing up | free | item data growing
//! down. Item `i`'s data sits just below item `i-1`'s, so the data of any run of
//! consecutive items is one contiguous range. Offsets are relative to the header end.
//!
//! These functions trust their arguments (the caller checked free space and slots);
//! the tree checker validates the whole block before it is written.

use ubtrfs_format::bytes::{le32, le64, put32, put64};
use ubtrfs_format::consts::*;
use ubtrfs_format::key::Key;

const NRITEMS_OFF: usize = 0x60;
const LEVEL_OFF: usize = 0x64;

pub(crate) fn nritems(b: &[u8]) -> usize {
    le32(b, NRITEMS_OFF, "header").unwrap_or(0) as usize
}
pub(crate) fn set_nritems(b: &mut [u8], n: usize) {
    put32(b, NRITEMS_OFF, n as u32);
}
pub(crate) fn level(b: &[u8]) -> u8 {
    b[LEVEL_OFF]
}
pub(crate) fn set_header(
    b: &mut [u8],
    bytenr: u64,
    generation: u64,
    owner: u64,
    level: u8,
    fsid: &[u8; 16],
    chunk_tree_uuid: &[u8; 16],
) {
    b[0x20..0x30].copy_from_slice(fsid);
    put64(b, 0x30, bytenr);
    put64(b, 0x38, MIXED_BACKREF_REV << BACKREF_REV_SHIFT);
    b[0x40..0x50].copy_from_slice(chunk_tree_uuid);
    put64(b, 0x50, generation);
    put64(b, 0x58, owner);
    b[LEVEL_OFF] = level;
}
pub(crate) fn set_bytenr(b: &mut [u8], v: u64) {
    put64(b, 0x30, v)
}
pub(crate) fn set_generation(b: &mut [u8], v: u64) {
    put64(b, 0x50, v)
}
pub(crate) fn set_owner(b: &mut [u8], v: u64) {
    put64(b, 0x58, v)
}
pub(crate) fn flags(b: &[u8]) -> u64 {
    le64(b, 0x38, "header").unwrap_or(0)
}
pub(crate) fn set_flags(b: &mut [u8], v: u64) {
    put64(b, 0x38, v)
}

fn item_off(slot: usize) -> usize {
    HEADER_SIZE + slot * ITEM_SIZE
}
pub(crate) fn item_key(b: &[u8], slot: usize) -> Key {
    read_key(b, item_off(slot))
}
pub(crate) fn item_offset(b: &[u8], slot: usize) -> usize {
    le32(b, item_off(slot) + DISK_KEY_SIZE, "item").unwrap_or(0) as usize
}
pub(crate) fn item_size(b: &[u8], slot: usize) -> usize {
    le32(b, item_off(slot) + DISK_KEY_SIZE + 4, "item").unwrap_or(0) as usize
}
fn set_item_offset(b: &mut [u8], slot: usize, v: usize) {
    put32(b, item_off(slot) + DISK_KEY_SIZE, v as u32)
}
fn set_item_size(b: &mut [u8], slot: usize, v: usize) {
    put32(b, item_off(slot) + DISK_KEY_SIZE + 4, v as u32)
}
pub(crate) fn set_item_key(b: &mut [u8], slot: usize, k: &Key) {
    write_key(b, item_off(slot), k)
}
/// Byte range of item `slot`'s data within the block.
pub(crate) fn item_range(b: &[u8], slot: usize) -> std::ops::Range<usize> {
    let s = HEADER_SIZE + item_offset(b, slot);
    s..s + item_size(b, slot)
}
pub(crate) fn item_data(b: &[u8], slot: usize) -> &[u8] {
    &b[item_range(b, slot)]
}
pub(crate) fn item_data_mut(b: &mut [u8], slot: usize) -> &mut [u8] {
    let r = item_range(b, slot);
    &mut b[r]
}

pub(crate) fn read_key(b: &[u8], off: usize) -> Key {
    Key::new(
        le64(b, off, "key").unwrap_or(0),
        b[off + 8],
        le64(b, off + 9, "key").unwrap_or(0),
    )
}
pub(crate) fn write_key(b: &mut [u8], off: usize, k: &Key) {
    put64(b, off, k.objectid);
    b[off + 8] = k.ty;
    put64(b, off + 9, k.offset);
}

/// Data area size of a leaf (block size minus header).
pub(crate) fn leaf_data_size(b: &[u8]) -> usize {
    b.len() - HEADER_SIZE
}
/// Offset (relative to the header end) where the packed data area starts.
fn leaf_data_end(b: &[u8]) -> usize {
    let n = nritems(b);
    if n == 0 {
        leaf_data_size(b)
    } else {
        item_offset(b, n - 1)
    }
}
/// Bytes used by items `start..start+nr` (headers and data).
pub(crate) fn leaf_space_used(b: &[u8], start: usize, nr: usize) -> usize {
    if nr == 0 {
        return 0;
    }
    let first_end = item_offset(b, start) + item_size(b, start);
    let last = item_offset(b, start + nr - 1);
    first_end - last + nr * ITEM_SIZE
}
pub(crate) fn leaf_free_space(b: &[u8]) -> usize {
    let n = nritems(b);
    leaf_data_size(b).saturating_sub(leaf_space_used(b, 0, n))
}

/// Opens `sizes.len()` items at `slot` with the given keys and data sizes (data
/// uninitialised: zeroes are not promised). One memmove shifts the data of the items
/// after `slot`, one memmove shifts their headers.
pub(crate) fn leaf_insert_empty(b: &mut [u8], slot: usize, keys: &[Key], sizes: &[usize]) {
    let n = nritems(b);
    let total: usize = sizes.iter().sum();
    let add = keys.len();
    let data_end = leaf_data_end(b);
    let old_data = if slot < n {
        item_offset(b, slot) + item_size(b, slot)
    } else {
        data_end
    };
    if slot < n {
        // Shift the data of items slot.. down by `total` and their headers right.
        let src = HEADER_SIZE + data_end..HEADER_SIZE + old_data;
        b.copy_within(src, HEADER_SIZE + data_end - total);
        for i in slot..n {
            let o = item_offset(b, i);
            set_item_offset(b, i, o - total);
        }
        b.copy_within(item_off(slot)..item_off(n), item_off(slot + add));
    }
    let mut off = old_data;
    for (i, (k, &sz)) in keys.iter().zip(sizes).enumerate() {
        off -= sz;
        set_item_key(b, slot + i, k);
        set_item_offset(b, slot + i, off);
        set_item_size(b, slot + i, sz);
    }
    set_nritems(b, n + add);
}

/// Deletes items `slot..slot+nr`, closing the gap in the data area with one memmove.
pub(crate) fn leaf_del_items(b: &mut [u8], slot: usize, nr: usize) {
    let n = nritems(b);
    if nr == 0 {
        return;
    }
    let dsize: usize = (slot..slot + nr).map(|i| item_size(b, i)).sum();
    let data_end = leaf_data_end(b);
    if slot + nr < n {
        let last_del = item_offset(b, slot + nr - 1);
        b.copy_within(
            HEADER_SIZE + data_end..HEADER_SIZE + last_del,
            HEADER_SIZE + data_end + dsize,
        );
        for i in slot + nr..n {
            let o = item_offset(b, i);
            set_item_offset(b, i, o + dsize);
        }
        b.copy_within(item_off(slot + nr)..item_off(n), item_off(slot));
    }
    set_nritems(b, n - nr);
}

/// Changes item `slot`'s data size, keeping its leading bytes (extension bytes at the
/// end are not initialised).
pub(crate) fn leaf_resize_item(b: &mut [u8], slot: usize, new_size: usize) {
    let n = nritems(b);
    let old = item_size(b, slot);
    if new_size == old {
        return;
    }
    let data_end = leaf_data_end(b);
    let start = item_offset(b, slot);
    if new_size > old {
        let extra = new_size - old;
        // Move everything from the data end up to the end of this item down by extra.
        b.copy_within(
            HEADER_SIZE + data_end..HEADER_SIZE + start + old,
            HEADER_SIZE + data_end - extra,
        );
        for i in slot..n {
            let o = item_offset(b, i);
            set_item_offset(b, i, o - extra);
        }
    } else {
        let less = old - new_size;
        b.copy_within(
            HEADER_SIZE + data_end..HEADER_SIZE + start + new_size,
            HEADER_SIZE + data_end + less,
        );
        for i in slot..n {
            let o = item_offset(b, i);
            set_item_offset(b, i, o + less);
        }
    }
    set_item_size(b, slot, new_size);
}

/// Copies items `start..start+nr` of leaf `src` into leaf `dst` at `dst_slot` (which must
/// be 0 or dst's item count): one copy for the headers' keys/sizes via insert, one copy
/// for all their data, since both runs are contiguous and laid out alike.
pub(crate) fn leaf_copy_items(
    dst: &mut [u8],
    dst_slot: usize,
    src: &[u8],
    start: usize,
    nr: usize,
) {
    if nr == 0 {
        return;
    }
    let keys: Vec<Key> = (start..start + nr).map(|i| item_key(src, i)).collect();
    let sizes: Vec<usize> = (start..start + nr).map(|i| item_size(src, i)).collect();
    leaf_insert_empty(dst, dst_slot, &keys, &sizes);
    let src_lo = HEADER_SIZE + item_offset(src, start + nr - 1);
    let src_hi = HEADER_SIZE + item_offset(src, start) + item_size(src, start);
    let dst_lo = HEADER_SIZE + item_offset(dst, dst_slot + nr - 1);
    dst[dst_lo..dst_lo + (src_hi - src_lo)].copy_from_slice(&src[src_lo..src_hi]);
}

// ---- nodes ----

fn ptr_off(slot: usize) -> usize {
    HEADER_SIZE + slot * KEY_PTR_SIZE
}
pub(crate) fn node_key(b: &[u8], slot: usize) -> Key {
    read_key(b, ptr_off(slot))
}
pub(crate) fn node_blockptr(b: &[u8], slot: usize) -> u64 {
    le64(b, ptr_off(slot) + DISK_KEY_SIZE, "ptr").unwrap_or(0)
}
pub(crate) fn node_ptr_gen(b: &[u8], slot: usize) -> u64 {
    le64(b, ptr_off(slot) + DISK_KEY_SIZE + 8, "ptr").unwrap_or(0)
}
pub(crate) fn set_node_key(b: &mut [u8], slot: usize, k: &Key) {
    write_key(b, ptr_off(slot), k)
}
pub(crate) fn set_node_ptr(b: &mut [u8], slot: usize, bytenr: u64, generation: u64) {
    put64(b, ptr_off(slot) + DISK_KEY_SIZE, bytenr);
    put64(b, ptr_off(slot) + DISK_KEY_SIZE + 8, generation);
}
pub(crate) fn node_ptrs_max(b: &[u8]) -> usize {
    (b.len() - HEADER_SIZE) / KEY_PTR_SIZE
}
pub(crate) fn node_insert_ptr(b: &mut [u8], slot: usize, k: &Key, bytenr: u64, generation: u64) {
    let n = nritems(b);
    if slot < n {
        b.copy_within(ptr_off(slot)..ptr_off(n), ptr_off(slot + 1));
    }
    set_node_key(b, slot, k);
    set_node_ptr(b, slot, bytenr, generation);
    set_nritems(b, n + 1);
}
pub(crate) fn node_del_ptrs(b: &mut [u8], slot: usize, nr: usize) {
    let n = nritems(b);
    if slot + nr < n {
        b.copy_within(ptr_off(slot + nr)..ptr_off(n), ptr_off(slot));
    }
    set_nritems(b, n - nr);
}
/// Copies pointers `start..start+nr` of `src` into `dst` at `dst_slot` in one copy.
pub(crate) fn node_copy_ptrs(dst: &mut [u8], dst_slot: usize, src: &[u8], start: usize, nr: usize) {
    let n = nritems(dst);
    if dst_slot < n {
        dst.copy_within(ptr_off(dst_slot)..ptr_off(n), ptr_off(dst_slot + nr));
    }
    dst[ptr_off(dst_slot)..ptr_off(dst_slot + nr)]
        .copy_from_slice(&src[ptr_off(start)..ptr_off(start + nr)]);
    set_nritems(dst, n + nr);
}

/// First key of a leaf or node (None when empty).
pub(crate) fn first_key(b: &[u8]) -> Option<Key> {
    if nritems(b) == 0 {
        None
    } else if level(b) == 0 {
        Some(item_key(b, 0))
    } else {
        Some(node_key(b, 0))
    }
}

/// Binary search: Ok(slot) when `key` is present, else Err(slot where it would go).
pub(crate) fn bin_search(b: &[u8], key: &Key) -> Result<usize, usize> {
    let n = nritems(b);
    let leaf = level(b) == 0;
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        let k = if leaf {
            item_key(b, mid)
        } else {
            node_key(b, mid)
        };
        match k.cmp(key) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok(mid),
        }
    }
    Err(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(size: usize) -> Vec<u8> {
        vec![0u8; size]
    }
    fn put(b: &mut [u8], slot: usize, k: u64, data: &[u8]) {
        leaf_insert_empty(b, slot, &[Key::new(k, 1, 0)], &[data.len()]);
        item_data_mut(b, slot).copy_from_slice(data);
    }
    fn dump(b: &[u8]) -> Vec<(u64, Vec<u8>)> {
        (0..nritems(b))
            .map(|i| (item_key(b, i).objectid, item_data(b, i).to_vec()))
            .collect()
    }

    #[test]
    fn insert_delete_resize_keep_data() {
        let mut b = leaf(4096);
        put(&mut b, 0, 10, b"ten");
        put(&mut b, 1, 30, b"thirty");
        put(&mut b, 1, 20, b"twenty!");
        put(&mut b, 0, 5, b"");
        assert_eq!(
            dump(&b),
            vec![
                (5, b"".to_vec()),
                (10, b"ten".to_vec()),
                (20, b"twenty!".to_vec()),
                (30, b"thirty".to_vec())
            ]
        );
        let used = leaf_space_used(&b, 0, 4);
        assert_eq!(used, 16 + 4 * ITEM_SIZE);
        assert_eq!(leaf_free_space(&b), 4096 - HEADER_SIZE - used);
        leaf_resize_item(&mut b, 1, 6);
        item_data_mut(&mut b, 1)[3..].copy_from_slice(b"XYZ");
        leaf_resize_item(&mut b, 2, 2);
        assert_eq!(dump(&b)[1].1, b"tenXYZ".to_vec());
        assert_eq!(dump(&b)[2].1, b"tw".to_vec());
        assert_eq!(dump(&b)[3].1, b"thirty".to_vec());
        leaf_del_items(&mut b, 1, 2);
        assert_eq!(dump(&b), vec![(5, b"".to_vec()), (30, b"thirty".to_vec())]);
        assert_eq!(leaf_free_space(&b), 4096 - HEADER_SIZE - 6 - 2 * ITEM_SIZE);
    }

    #[test]
    fn bulk_copy_between_leaves() {
        let mut a = leaf(4096);
        for i in 0..10u64 {
            put(&mut a, i as usize, i, &vec![i as u8; i as usize + 1]);
        }
        let mut c = leaf(4096);
        put(&mut c, 0, 100, b"x");
        leaf_copy_items(&mut c, 0, &a, 6, 4);
        leaf_del_items(&mut a, 6, 4);
        let mut d = leaf(4096);
        leaf_copy_items(&mut d, 0, &a, 0, 3);
        leaf_copy_items(&mut d, 3, &a, 3, 3);
        assert_eq!(nritems(&d), 6);
        for i in 0..6u64 {
            assert_eq!(
                item_data(&d, i as usize),
                &vec![i as u8; i as usize + 1][..]
            );
        }
        assert_eq!(
            dump(&c).iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![6, 7, 8, 9, 100]
        );
        assert_eq!(item_data(&c, 3), &[9u8; 10][..]);
    }

    #[test]
    fn node_ptr_ops() {
        let mut b = leaf(4096);
        b[LEVEL_OFF] = 1;
        node_insert_ptr(&mut b, 0, &Key::new(5, 0, 0), 4096, 7);
        node_insert_ptr(&mut b, 0, &Key::new(1, 0, 0), 8192, 7);
        node_insert_ptr(&mut b, 2, &Key::new(9, 0, 0), 12288, 8);
        assert_eq!(bin_search(&b, &Key::new(5, 0, 0)), Ok(1));
        assert_eq!(bin_search(&b, &Key::new(6, 0, 0)), Err(2));
        node_del_ptrs(&mut b, 0, 1);
        assert_eq!(node_blockptr(&b, 0), 4096);
        assert_eq!(node_ptr_gen(&b, 1), 8);
    }
}
