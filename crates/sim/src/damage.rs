//! Damage to btrfs images, one precise change at a time, for the tests of a checker
//! (`ubtrfs check` against `btrfs check`).
//!
//! An [`Image`] is a filesystem's device files. It finds places with the engine
//! (a read-only [`Filesystem`] opened for the lookup and closed again before any
//! byte is written: no cache ever sees a half-made change) and changes them with
//! plain `write_all_at` on the files:
//!
//! * items, found by tree id and exact key ([`Image::item`], [`Image::items`]): a
//!   body patched ([`Image::patch`], [`Image::edit_item`]), the item deleted
//!   ([`Image::delete`]) or its key changed ([`Image::rekey`]). The leaf's checksum
//!   is recomputed and the leaf written to every copy (DUP, RAID1...), so that the
//!   only fault is the one made; when the first key of a leaf changes, the key
//!   pointers above it follow (else every such edit would also be a first-key
//!   mismatch);
//! * tree blocks: any edit with the checksum recomputed ([`Image::edit_block`]), or
//!   a byte changed without it, in one copy or all ([`Image::poke_block`]);
//! * data: a byte of a data sector changed ([`Image::poke_data`]);
//! * superblocks: a copy edited, with or without its checksum ([`Image::edit_super`]).
//!
//! The chunk map, node size and checksum type are read once, when the [`Image`] is
//! made: later edits keep finding the copies of a block even after a case damaged
//! the chunk tree itself. Every error is a `String` naming what was looked for.

use std::collections::BTreeMap;
use std::fs::OpenOptions as FileOpen;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ubtrfs_core::format::consts::{
    super_mirror_offset, HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE, SUPER_INFO_SIZE,
};
use ubtrfs_core::format::csum::CsumType;
use ubtrfs_core::format::key::Key;
use ubtrfs_core::format::tree::{finish_block, BlockView};
use ubtrfs_core::{
    read_best_super, search_slot, FileDevice, Filesystem, OpenOptions, RootPtr, TreeIter,
};

/// One leaf item, as found: where it is and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Tree id the item was looked up in.
    pub tree: u64,
    /// Its key.
    pub key: Key,
    /// Logical address of the leaf holding it.
    pub leaf: u64,
    /// Its slot in that leaf.
    pub slot: usize,
    /// Offset of its body inside the leaf block.
    pub body_offset: usize,
    /// Its body.
    pub body: Vec<u8>,
    /// The nodes above the leaf, lowest first: (logical address, slot of the pointer
    /// leading down here).
    pub parents: Vec<(u64, usize)>,
}

/// Maps a logical address to every copy of it: (devid, physical offset).
type Mapper = Box<dyn Fn(u64) -> Result<Vec<(u64, u64)>, String> + Send + Sync>;

/// The device files of one filesystem, and how its logical addresses map onto them.
pub struct Image {
    devices: BTreeMap<u64, PathBuf>,
    map: Mapper,
    /// Tree block size.
    pub nodesize: usize,
    /// Data sector size.
    pub sectorsize: usize,
    /// Checksum algorithm of tree blocks, data and superblocks.
    pub csum_type: CsumType,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("devices", &self.devices)
            .field("nodesize", &self.nodesize)
            .finish_non_exhaustive()
    }
}

/// Byte offset of leaf item header `slot` in a block.
pub fn item_header_offset(slot: usize) -> usize {
    HEADER_SIZE + slot * ITEM_SIZE
}

/// Byte offset of node key pointer `slot` in a block.
pub fn key_ptr_offset(slot: usize) -> usize {
    HEADER_SIZE + slot * KEY_PTR_SIZE
}

/// Reads a little-endian u64 at `off`.
pub fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Reads a little-endian u32 at `off`.
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// Writes a little-endian u64 at `off`.
pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Writes a little-endian u32 at `off`.
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes a little-endian u16 at `off`.
pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// Adds `delta` (wrapping) to the little-endian u64 at `off`.
pub fn add_u64(b: &mut [u8], off: usize, delta: i64) {
    put_u64(b, off, get_u64(b, off).wrapping_add_signed(delta));
}

/// Adds `delta` (wrapping) to the little-endian u32 at `off`.
pub fn add_u32(b: &mut [u8], off: usize, delta: i32) {
    put_u32(b, off, get_u32(b, off).wrapping_add_signed(delta));
}

fn open_fs(paths: &[&Path]) -> Result<Filesystem, String> {
    Filesystem::open_paths(paths, OpenOptions::default())
        .map_err(|e| format!("opening {paths:?}: {e}"))
}

/// The root pointer of tree `tree`: the root and chunk trees from the superblock,
/// the others (subvolumes included) from their ROOT_ITEMs.
pub fn root_ptr(fs: &Filesystem, tree: u64) -> Result<RootPtr, String> {
    if let Some(r) = fs.info.tree_ptr(tree) {
        return Ok(r);
    }
    fs.try_root(tree)
        .map_err(|e| format!("tree {tree}: {e}"))?
        .ok_or_else(|| format!("no tree {tree}"))
}

/// The item with exactly `key` in the open tree `root`, with its path.
fn find_in(fs: &Filesystem, root: &RootPtr, key: Key) -> Result<Found, String> {
    let p =
        search_slot(&fs.info, root, &key).map_err(|e| format!("tree {}: {key}: {e}", root.id))?;
    if !p.valid() || p.key().map_err(|e| e.to_string())? != key {
        return Err(format!("tree {}: no item {key}", root.id));
    }
    let leaf = p.leaf();
    let ih = leaf
        .view()
        .item(p.slot())
        .map_err(|e| format!("tree {}: {key}: {e}", root.id))?;
    Ok(Found {
        tree: root.id,
        key,
        leaf: leaf.bytenr,
        slot: p.slot(),
        body_offset: HEADER_SIZE + ih.offset as usize,
        body: p.data().map_err(|e| e.to_string())?.to_vec(),
        parents: p.nodes[1..].iter().map(|(b, s)| (b.bytenr, *s)).collect(),
    })
}

impl Image {
    /// The filesystem whose devices are the image files `paths` (all of them).
    pub fn new<P: AsRef<Path>>(paths: &[P]) -> Result<Image, String> {
        let mut devices = BTreeMap::new();
        for p in paths {
            let p = p.as_ref();
            let dev = FileDevice::open(p, false).map_err(|e| format!("{}: {e}", p.display()))?;
            let (sb, _) = read_best_super(&dev).map_err(|e| format!("{}: {e}", p.display()))?;
            devices.insert(sb.dev_item.devid, p.to_path_buf());
        }
        let all: Vec<&Path> = paths.iter().map(|p| p.as_ref()).collect();
        let fs = open_fs(&all)?;
        let chunks = fs.info.chunk_map.clone();
        let map: Mapper = Box::new(move |l| {
            let e = chunks.lookup(l).map_err(|e| format!("logical {l}: {e}"))?;
            (0..e.num_mirrors())
                .map(|m| {
                    e.map(l, m)
                        .map(|p| (p.devid, p.offset))
                        .map_err(|e| format!("logical {l} copy {m}: {e}"))
                })
                .collect()
        });
        Ok(Image {
            devices,
            map,
            nodesize: fs.info.nodesize as usize,
            sectorsize: fs.info.sectorsize as usize,
            csum_type: fs.info.csum_type,
        })
    }

    /// The device files by devid.
    pub fn devices(&self) -> &BTreeMap<u64, PathBuf> {
        &self.devices
    }

    /// Opens the filesystem read-only with the engine (to look something up; drop it
    /// before changing anything).
    pub fn open(&self) -> Result<Filesystem, String> {
        let paths: Vec<&Path> = self.devices.values().map(|p| p.as_path()).collect();
        open_fs(&paths)
    }

    /// The item with exactly `key` in tree `tree`.
    pub fn item(&self, tree: u64, key: Key) -> Result<Found, String> {
        let fs = self.open()?;
        let root = root_ptr(&fs, tree)?;
        find_in(&fs, &root, key)
    }

    /// Every item of tree `tree` with a key in `[start, end]`, in key order.
    pub fn items(&self, tree: u64, start: Key, end: Key) -> Result<Vec<Found>, String> {
        let fs = self.open()?;
        let root = root_ptr(&fs, tree)?;
        let mut keys = Vec::new();
        let iter =
            TreeIter::new(&fs.info, &root, start, end).map_err(|e| format!("tree {tree}: {e}"))?;
        for it in iter {
            keys.push(it.map_err(|e| format!("tree {tree}: {e}"))?.key());
        }
        keys.into_iter().map(|k| find_in(&fs, &root, k)).collect()
    }

    /// The first item of tree `tree` (in key order) for which `pred(key, body)` holds.
    pub fn find(
        &self,
        tree: u64,
        mut pred: impl FnMut(&Key, &[u8]) -> bool,
    ) -> Result<Found, String> {
        let fs = self.open()?;
        let root = root_ptr(&fs, tree)?;
        let iter = TreeIter::new(&fs.info, &root, Key::MIN, Key::MAX)
            .map_err(|e| format!("tree {tree}: {e}"))?;
        for it in iter {
            let it = it.map_err(|e| format!("tree {tree}: {e}"))?;
            if pred(&it.key(), it.data()) {
                return find_in(&fs, &root, it.key());
            }
        }
        Err(format!("tree {tree}: no item matches"))
    }

    /// Every copy of logical address `logical`: (device file, physical offset).
    pub fn copies(&self, logical: u64) -> Result<Vec<(PathBuf, u64)>, String> {
        (self.map)(logical)?
            .into_iter()
            .map(|(devid, off)| {
                let p = self
                    .devices
                    .get(&devid)
                    .ok_or_else(|| format!("logical {logical}: devid {devid} has no file"))?;
                Ok((p.clone(), off))
            })
            .collect()
    }

    fn read_at(path: &Path, off: u64, buf: &mut [u8]) -> Result<(), String> {
        std::fs::File::open(path)
            .and_then(|f| f.read_exact_at(buf, off))
            .map_err(|e| format!("reading {} at {off}: {e}", path.display()))
    }

    fn write_at(path: &Path, off: u64, buf: &[u8]) -> Result<(), String> {
        FileOpen::new()
            .write(true)
            .open(path)
            .and_then(|f| f.write_all_at(buf, off))
            .map_err(|e| format!("writing {} at {off}: {e}", path.display()))
    }

    /// The bytes of copy `mirror` (0-based) of the tree block at `logical`, as stored.
    pub fn read_block(&self, logical: u64, mirror: usize) -> Result<Vec<u8>, String> {
        let copies = self.copies(logical)?;
        let (path, off) = copies
            .get(mirror)
            .ok_or_else(|| format!("tree block {logical} has no copy {mirror}"))?;
        let mut buf = vec![0u8; self.nodesize];
        Self::read_at(path, *off, &mut buf)?;
        Ok(buf)
    }

    /// Writes `buf` as the tree block at `logical`, in every copy, as it is.
    pub fn write_block(&self, logical: u64, buf: &[u8]) -> Result<(), String> {
        for (path, off) in self.copies(logical)? {
            Self::write_at(&path, off, buf)?;
        }
        Ok(())
    }

    /// Edits the tree block at `logical` (starting from its first copy) with `f`,
    /// recomputes its checksum and writes it to every copy.
    pub fn edit_block(&self, logical: u64, f: impl FnOnce(&mut [u8])) -> Result<(), String> {
        let mut buf = self.read_block(logical, 0)?;
        f(&mut buf);
        finish_block(&mut buf, self.csum_type);
        self.write_block(logical, &buf)
    }

    /// Changes byte `offset` of the tree block at `logical` (XOR 0x5a) in copy
    /// `mirror`, or in every copy, leaving its checksum wrong.
    pub fn poke_block(
        &self,
        logical: u64,
        mirror: Option<usize>,
        offset: usize,
    ) -> Result<(), String> {
        self.poke(logical + offset as u64, mirror, "tree block")
    }

    /// Changes the data byte at logical `logical` (XOR 0x5a) in copy `mirror`, or in
    /// every copy.
    pub fn poke_data(&self, logical: u64, mirror: Option<usize>) -> Result<(), String> {
        self.poke(logical, mirror, "data")
    }

    fn poke(&self, logical: u64, mirror: Option<usize>, what: &str) -> Result<(), String> {
        let copies = self.copies(logical)?;
        if mirror.is_some_and(|m| m >= copies.len()) {
            return Err(format!("{what} at {logical} has {} copies", copies.len()));
        }
        for (i, (path, off)) in copies.iter().enumerate() {
            if mirror.is_some_and(|m| m != i) {
                continue;
            }
            let mut b = [0u8; 1];
            Self::read_at(path, *off, &mut b)?;
            b[0] ^= 0x5a;
            Self::write_at(path, *off, &b)?;
        }
        Ok(())
    }

    /// The leaf of `it` as stored (first copy), checked to still hold `it` where it
    /// was found.
    fn leaf_of(&self, it: &Found) -> Result<Vec<u8>, String> {
        let buf = self.read_block(it.leaf, 0)?;
        let v = BlockView::new(&buf);
        let now = v.item_key(it.slot).map_err(|e| e.to_string())?;
        if v.level() != 0 || now != it.key || v.nritems() as usize <= it.slot {
            return Err(format!(
                "leaf {} slot {} no longer holds {} (found {now})",
                it.leaf, it.slot, it.key
            ));
        }
        Ok(buf)
    }

    /// Writes `bytes` at `offset` into the body of item `it` (checksum recomputed,
    /// every copy).
    pub fn patch(&self, it: &Found, offset: usize, bytes: &[u8]) -> Result<(), String> {
        if offset + bytes.len() > it.body.len() {
            return Err(format!(
                "patch of {} bytes at {offset} past the end of {} ({} bytes)",
                bytes.len(),
                it.key,
                it.body.len()
            ));
        }
        self.edit_item(it, |b| {
            b[offset..offset + bytes.len()].copy_from_slice(bytes)
        })
    }

    /// Edits the body of item `it` in place with `f` (checksum recomputed, every copy).
    pub fn edit_item(&self, it: &Found, f: impl FnOnce(&mut [u8])) -> Result<(), String> {
        let mut buf = self.leaf_of(it)?;
        let body = &mut buf[it.body_offset..it.body_offset + it.body.len()];
        f(body);
        finish_block(&mut buf, self.csum_type);
        self.write_block(it.leaf, &buf)
    }

    /// Replaces the body of item `it` with `body`, of any size that fits the leaf's
    /// free space: the item's data keeps its end, the bodies of the later items move
    /// by the difference (as btrfs_extend_item / btrfs_truncate_item leave a leaf).
    pub fn replace_body(&self, it: &Found, body: &[u8]) -> Result<(), String> {
        let mut buf = self.leaf_of(it)?;
        let v = BlockView::new(&buf);
        let n = v.nritems() as usize;
        let last = v.item(n - 1).map_err(|e| e.to_string())?;
        let data_end = HEADER_SIZE + last.offset as usize;
        let grow = body.len() as i64 - it.body.len() as i64;
        let free = data_end as i64 - item_header_offset(n) as i64;
        if grow > free {
            return Err(format!(
                "{} grows by {grow} bytes; leaf {} has {free} free",
                it.key, it.leaf
            ));
        }
        let end = it.body_offset + it.body.len();
        let new_start = (end as i64 - body.len() as i64) as usize;
        let new_data_end = (data_end as i64 - grow) as usize;
        // The later items' bodies, then this one's, end where they must.
        buf.copy_within(data_end..it.body_offset, new_data_end);
        buf[new_start..end].copy_from_slice(body);
        if grow < 0 {
            buf[data_end..new_data_end].fill(0);
        }
        for j in it.slot..n {
            let h = item_header_offset(j) + 17;
            let off = get_u32(&buf, h) as i64 - grow;
            put_u32(&mut buf, h, off as u32);
        }
        put_u32(
            &mut buf,
            item_header_offset(it.slot) + 21,
            body.len() as u32,
        );
        finish_block(&mut buf, self.csum_type);
        self.write_block(it.leaf, &buf)
    }

    /// Removes item `it` from its leaf (later item headers move down a slot, their
    /// bodies up by its size), as the kernel's btrfs_del_items does; the key pointers
    /// above follow when it was the leaf's first item. The leaf must keep one item.
    pub fn delete(&self, it: &Found) -> Result<(), String> {
        let mut buf = self.leaf_of(it)?;
        let n = BlockView::new(&buf).nritems() as usize;
        if n < 2 {
            return Err(format!("deleting {} would empty leaf {}", it.key, it.leaf));
        }
        let s = it.slot;
        let size = it.body.len();
        let last = BlockView::new(&buf)
            .item(n - 1)
            .map_err(|e| e.to_string())?;
        let data_end = HEADER_SIZE + last.offset as usize;
        // Bodies of the later items sit below this one's: move them up over it.
        buf.copy_within(data_end..it.body_offset, data_end + size);
        buf[data_end..data_end + size].fill(0);
        for j in s + 1..n {
            let h = item_header_offset(j) + 17;
            let off = get_u32(&buf, h);
            put_u32(&mut buf, h, off + size as u32);
        }
        buf.copy_within(
            item_header_offset(s + 1)..item_header_offset(n),
            item_header_offset(s),
        );
        buf[item_header_offset(n - 1)..item_header_offset(n)].fill(0);
        put_u32(&mut buf, 0x60, (n - 1) as u32);
        let first = BlockView::new(&buf)
            .item_key(0)
            .map_err(|e| e.to_string())?;
        finish_block(&mut buf, self.csum_type);
        self.write_block(it.leaf, &buf)?;
        if s == 0 {
            self.set_parent_keys(it, first)?;
        }
        Ok(())
    }

    /// Changes the key of item `it` to `new` (its body stays); the key pointers above
    /// follow when it is the leaf's first item. Key order is not checked: a key out
    /// of order is a way to damage a leaf too.
    pub fn rekey(&self, it: &Found, new: Key) -> Result<(), String> {
        let mut buf = self.leaf_of(it)?;
        let h = item_header_offset(it.slot);
        new.write(&mut buf[h..h + 17]);
        finish_block(&mut buf, self.csum_type);
        self.write_block(it.leaf, &buf)?;
        if it.slot == 0 {
            self.set_parent_keys(it, new)?;
        }
        Ok(())
    }

    /// Sets the key of the pointers leading to `it`'s leaf to `first`, as far up as
    /// the pointer is its node's first.
    fn set_parent_keys(&self, it: &Found, first: Key) -> Result<(), String> {
        for &(node, slot) in &it.parents {
            self.edit_block(node, |b| {
                let o = key_ptr_offset(slot);
                first.write(&mut b[o..o + 17]);
            })?;
            if slot != 0 {
                break;
            }
        }
        Ok(())
    }

    /// Edits superblock copy `copy` (0: the primary at 64 KiB, 1: 64 MiB, 2: 256 GiB)
    /// of every device with `f` over its 4096 bytes; its checksum is recomputed when
    /// `fix_csum`. A device too small for that copy is an error.
    pub fn edit_super(
        &self,
        copy: usize,
        fix_csum: bool,
        f: impl Fn(&mut [u8]),
    ) -> Result<(), String> {
        let off = super_mirror_offset(copy);
        for path in self.devices.values() {
            let mut buf = vec![0u8; SUPER_INFO_SIZE];
            Self::read_at(path, off, &mut buf)?;
            f(&mut buf);
            if fix_csum {
                finish_block(&mut buf, self.csum_type);
            }
            Self::write_at(path, off, &buf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use ubtrfs_core::format::consts::{
        DIR_INDEX_KEY, FIRST_FREE_OBJECTID, FS_TREE_OBJECTID, INODE_REF_KEY,
    };
    use ubtrfs_core::tools::mkfs::{make_filesystem, MkfsOptions};
    use ubtrfs_core::NewInode;

    /// A filesystem made by ubtrfs with 4 KiB nodes, DUP metadata and 300 empty
    /// files in the top directory: a fs tree of two levels.
    fn image(dir: &Path) -> PathBuf {
        let p = dir.join("t.img");
        std::fs::File::create(&p)
            .and_then(|f| f.set_len(256 << 20))
            .unwrap();
        let dev: Arc<dyn ubtrfs_core::Device> = Arc::new(FileDevice::open(&p, true).unwrap());
        let opts = MkfsOptions {
            nodesize: 4096,
            ..Default::default()
        };
        let mut t = make_filesystem(dev, &opts).unwrap();
        for i in 0..300 {
            let attr = NewInode {
                mode: 0o100644,
                ..Default::default()
            };
            let name = format!("f{i:03}");
            t.create(FS_TREE_OBJECTID, FIRST_FREE_OBJECTID, name.as_bytes(), attr)
                .unwrap();
        }
        t.commit().unwrap();
        p
    }

    /// Every key of the fs tree, read through the engine (whose tree checker and
    /// parent checks see every block on the way).
    fn keys(img: &Image) -> Vec<Key> {
        img.items(FS_TREE_OBJECTID, Key::MIN, Key::MAX)
            .unwrap()
            .into_iter()
            .map(|f| f.key)
            .collect()
    }

    /// The first item of type `ty` that is the first of a leaf other than the
    /// tree's first.
    fn first_in_leaf(img: &Image, ty: u8) -> Found {
        img.items(FS_TREE_OBJECTID, Key::MIN, Key::MAX)
            .unwrap()
            .into_iter()
            .find(|f| f.key.ty == ty && f.slot == 0 && f.parents.first().is_some_and(|p| p.1 > 0))
            .unwrap()
    }

    #[test]
    fn edits_leave_well_formed_trees() {
        let dir = tempfile::tempdir().unwrap();
        let img = Image::new(&[image(dir.path())]).unwrap();
        let mut all = keys(&img);
        assert!(all.len() > 900, "{} items", all.len());

        // Deleting a leaf's first item: the pointers above follow.
        let f = first_in_leaf(&img, DIR_INDEX_KEY);
        img.delete(&f).unwrap();
        all.retain(|k| *k != f.key);
        assert_eq!(keys(&img), all);

        // A new key for a leaf's first item (another parent in an INODE_REF, still
        // past the previous leaf's last key).
        let f = first_in_leaf(&img, INODE_REF_KEY);
        let prev = all[all.iter().position(|k| *k == f.key).unwrap() - 1];
        let new = Key::new(f.key.objectid, f.key.ty, f.key.offset - 1);
        assert!(prev < new);
        img.rekey(&f, new).unwrap();
        for k in all.iter_mut().filter(|k| **k == f.key) {
            *k = new;
        }
        assert_eq!(keys(&img), all);
        assert_eq!(img.item(FS_TREE_OBJECTID, new).unwrap().body, f.body);

        // A body grown (a second name in an INODE_REF), then shrunk back, in the
        // middle of a leaf.
        let f = img
            .items(FS_TREE_OBJECTID, Key::MIN, Key::MAX)
            .unwrap()
            .into_iter()
            .find(|f| f.key.ty == INODE_REF_KEY && f.slot > 3)
            .unwrap();
        let mut grown = f.body.clone();
        grown.extend_from_slice(&1000u64.to_le_bytes());
        grown.extend_from_slice(&3u16.to_le_bytes());
        grown.extend_from_slice(b"abc");
        img.replace_body(&f, &grown).unwrap();
        let g = img.item(FS_TREE_OBJECTID, f.key).unwrap();
        assert_eq!(g.body, grown);
        assert_eq!(keys(&img), all);
        img.replace_body(&g, &f.body).unwrap();
        assert_eq!(img.item(FS_TREE_OBJECTID, f.key).unwrap().body, f.body);
        assert_eq!(keys(&img), all);

        // A patch, with the checksum right in both copies.
        let f = img.item(FS_TREE_OBJECTID, f.key).unwrap();
        img.patch(&f, 0, &[0xab]).unwrap();
        assert_eq!(img.item(FS_TREE_OBJECTID, f.key).unwrap().body[0], 0xab);
        assert_eq!(
            img.read_block(f.leaf, 0).unwrap(),
            img.read_block(f.leaf, 1).unwrap()
        );

        // A byte changed in one copy only: the other copy still reads.
        img.poke_block(f.leaf, Some(0), 500).unwrap();
        assert_ne!(
            img.read_block(f.leaf, 0).unwrap(),
            img.read_block(f.leaf, 1).unwrap()
        );
        assert_eq!(keys(&img), all);
    }
}
