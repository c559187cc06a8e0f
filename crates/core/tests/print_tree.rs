//! Compares `print_tree` output with btrfs-progs on a real image. Needs an image made by
//! root (see the module docs of `print_tree`), so it is ignored by default:
//!
//! ```text
//! UBTRFS_DUMP_IMAGE=/tmp/a.img UBTRFS_DUMP_OUT=/tmp/out \
//!     cargo test -p ubtrfs-core --test print_tree -- --ignored
//! ```
//!
//! (several devices separated by `:`) writes `OUT.tree` (dump-tree), `OUT.super` (dump-super -f) and, when
//! `UBTRFS_DUMP_TREE` / `UBTRFS_DUMP_BLOCK` are set, `OUT.t` / `OUT.b`.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use ubtrfs_core::format::superblock::SuperBlock;
use ubtrfs_core::tools::print_tree::{
    dump_super_with, dump_tree, dump_tree_with, parse_tree_name, DumpTreeOptions,
};
use ubtrfs_core::FsInfo;

#[test]
#[ignore]
fn dump_image_from_env() {
    let Ok(img) = std::env::var("UBTRFS_DUMP_IMAGE") else {
        eprintln!("UBTRFS_DUMP_IMAGE not set; nothing to do");
        return;
    };
    let out = std::env::var("UBTRFS_DUMP_OUT").unwrap_or_else(|_| "/tmp/ubtrfs-dump".into());
    let paths: Vec<&str> = img.split(':').collect();
    // dump-super of the first device, straight from the file (no filesystem open).
    let mirror: usize = std::env::var("UBTRFS_DUMP_MIRROR").map_or(0, |m| m.parse().unwrap());
    let bytenr = ubtrfs_core::format::consts::super_mirror_offset(mirror);
    let mut f = File::open(paths[0]).unwrap();
    let mut buf = vec![0u8; 4096];
    f.seek(SeekFrom::Start(bytenr)).unwrap();
    f.read_exact(&mut buf).unwrap();
    let sb = SuperBlock::parse(&buf).unwrap();
    std::fs::write(
        format!("{out}.super"),
        dump_super_with(&sb, bytenr, paths[0], true),
    )
    .unwrap();
    if std::env::var("UBTRFS_DUMP_SUPER_ONLY").is_ok() {
        return;
    }
    let fs = FsInfo::open_paths(&paths, Default::default()).unwrap();
    let mut w = BufWriter::new(File::create(format!("{out}.tree")).unwrap());
    dump_tree(&fs, None, None, &mut w).unwrap();
    w.flush().unwrap();
    if let Ok(t) = std::env::var("UBTRFS_DUMP_TREE") {
        let id = parse_tree_name(&t).expect("tree name");
        let mut w = BufWriter::new(File::create(format!("{out}.t")).unwrap());
        dump_tree(&fs, Some(id), None, &mut w).unwrap();
        w.flush().unwrap();
    }
    if let Ok(b) = std::env::var("UBTRFS_DUMP_BLOCK") {
        let mut w = BufWriter::new(File::create(format!("{out}.b")).unwrap());
        dump_tree(&fs, None, Some(b.parse().unwrap()), &mut w).unwrap();
        w.flush().unwrap();
    }
    // UBTRFS_DUMP_OPTS: comma-separated follow,dfs,csum-headers,csum-items,hide-names,
    // extents,device,uuid,roots,backups,
    // tree=T,block=B; written to OUT.o.
    if let Ok(o) = std::env::var("UBTRFS_DUMP_OPTS") {
        let mut opts = DumpTreeOptions::default();
        for w in o.split(',') {
            match w {
                "follow" => opts.follow = true,
                "dfs" => opts.dfs = true,
                "csum-headers" => opts.csum_headers = true,
                "csum-items" => opts.csum_items = true,
                "hide-names" => opts.hide_names = true,
                "extents" => opts.extents_only = true,
                "device" => opts.device_only = true,
                "uuid" => opts.uuid_only = true,
                "roots" => opts.roots_only = true,
                "backups" => opts.backups = true,
                w if w.starts_with("tree=") => opts.tree = parse_tree_name(&w[5..]),
                w if w.starts_with("block=") => opts.blocks.push(w[6..].parse().unwrap()),
                "" => {}
                w => panic!("unknown option {w}"),
            }
        }
        let mut w = BufWriter::new(File::create(format!("{out}.o")).unwrap());
        let r = dump_tree_with(&fs, &opts, &mut w);
        w.flush().unwrap();
        r.unwrap();
    }
}
