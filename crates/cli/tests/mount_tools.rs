//! Tools people use, on the read-write `ubtrfs mount`: tar, git, gcc and make,
//! SQLite with concurrent writers, and file locks. Each workload runs on a fresh
//! image mounted with `ubtrfs mount -o rw`, checks its own result (diff, `git fsck`,
//! the program's output, `PRAGMA integrity_check`), and is followed by the kernel
//! round trip: unmount, `btrfs check --readonly --check-data-csum` clean, the kernel
//! shows exactly what the FUSE mount showed (names, every stat field with st_ino and
//! times, contents, xattrs); then the kernel writes more and ubtrfs mounts the image
//! read-write again and goes on, followed by the round trip once more.
//!
//! The lock test runs one script on a kernel btrfs loop mount and on a ubtrfs mount
//! in the same run and wants the same results.
//!
//! Needs root (/dev/fuse, loop devices) and gcc, make, git, sqlite3, python3
//! (tests/install-deps.sh); skipped with a line outside CI.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;
use ubtrfs_sim::host::{bash_ok, btrfs_check, require_fuse, serial, shell_quote, Ubtrfs};
use ubtrfs_sim::mount::{kernel_round_trip, kernel_writes, mkfs_btrfs, FuseMount, KernelMount};

const UBTRFS: Ubtrfs = Ubtrfs::new(env!("CARGO_BIN_EXE_ubtrfs"));

/// A fresh 2 GiB image (mkfs.btrfs defaults) in `dir`.
fn fresh_image(dir: &Path) -> PathBuf {
    let img = dir.join("a.img");
    mkfs_btrfs(&img, 2 << 30, &[]);
    img
}

/// Mounts `img` with `ubtrfs mount -o rw`, runs `script` in the mount (bash,
/// `set -e`), unmounts, and does the kernel round trip. The script's stdout.
fn on_ubtrfs(img: &Path, script: &str, what: &str) -> String {
    let fm = FuseMount::start(&UBTRFS, &[img], &["rw"]);
    let out = bash_ok(&fm.mnt, script)
        .unwrap_or_else(|e| panic!("{what} on the ubtrfs mount: {e}\nserver log:\n{}", fm.log()));
    let seen = fm.walk_and_unmount();
    kernel_round_trip(img, &seen, what);
    out
}

/// Says how long a workload took (a figure for the report, never an assertion).
fn took(what: &str, t0: Instant) {
    eprintln!("{what}: {:.1} s", t0.elapsed().as_secs_f64());
}

/// `tar x` of a large tree (system headers, Perl modules and generated files: tens
/// of MB, thousands of entries), compared with its source by `diff -r` and by
/// `tar --compare` (contents, modes, owners, mtimes, link targets); `cp -a` of part
/// of it inside the mount keeps modes, owners, sizes, hard links and mtimes; `sync`.
#[test]
fn tools_tar_x_large_tree() {
    if !require_fuse("tools_tar_x_large_tree") {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let tarball = dir.path().join("src.tar");
    // Sources on every Debian machine that has gcc (libc6-dev, linux-libc-dev) and
    // perl, plus generated files (small ones in one big directory, a few large
    // ones, a hard link, a symlink) so the size does not depend on the host alone.
    let size = bash_ok(
        dir.path(),
        &format!(
            "mkdir -p src/gen/many src/gen/big
             cp -a /usr/include src/include
             cp -a /usr/share/perl5 src/perl5 2>/dev/null || mkdir src/perl5
             for i in $(seq 1 2000); do echo \"file $i\" > src/gen/many/f$i; done
             for i in 1 2 3 4; do head -c $((i * 3000000)) /dev/urandom > src/gen/big/r$i; done
             ln src/gen/big/r1 src/gen/big/r1.link
             ln -s ../many/f7 src/gen/big/sym
             chown -R 1000:1000 src/gen/many
             tar -C src -cf {} .
             echo \"$(du -sm src | cut -f1) MB, $(find src | wc -l) entries\"",
            shell_quote(&tarball)
        ),
    )
    .unwrap_or_else(|e| panic!("making the tarball: {e}"));
    eprintln!("tarball: {}", size.trim());
    let img = fresh_image(dir.path());
    let (s, t) = (shell_quote(&src), shell_quote(&tarball));
    on_ubtrfs(
        &img,
        &format!(
            "mkdir t && tar -C t -xpf {t}
             diff -r --no-dereference {s} t
             tar -C t --compare -f {t}
             cp -a t/gen gen-copy
             list() {{ (cd \"$1\" && find . -printf '%y %m %U %G %s %n %T@ %l %p\\n' | sort); }}
             diff <(list t/gen) <(list gen-copy)
             diff -r --no-dereference t/gen gen-copy
             sync"
        ),
        "tar x",
    );
    took("tar x + diff + round trip", t0);

    // The kernel removes part of the tree; ubtrfs extracts it again over the rest.
    let t1 = Instant::now();
    kernel_writes(&img, "rm -r t/include t/gen/many", "tar x");
    on_ubtrfs(
        &img,
        &format!(
            "tar -C t -xpf {t}
             diff -r --no-dereference {s} t
             tar -C t --compare -f {t}
             sync"
        ),
        "tar x again after the kernel's rm",
    );
    took("kernel rm + tar x again + round trip", t1);
}

/// The repository of this source tree, or (outside a git checkout) a fresh one
/// made of crates/ in `dir`.
fn source_repo(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if bash_ok(&root, "git rev-parse --git-dir >/dev/null 2>&1").is_ok() {
        return root;
    }
    let repo = dir.join("src-repo");
    bash_ok(
        dir,
        &format!(
            "git init -q {r} && cp -a {c} {r}/ && cd {r} && git add -A &&
             git -c user.name=t -c user.email=t@example.com commit -q -m import",
            r = shell_quote(&repo),
            c = shell_quote(&root.join("crates"))
        ),
    )
    .unwrap_or_else(|e| panic!("making a source repository: {e}"));
    repo
}

/// No automatic gc or maintenance after a commit: git runs those detached, and one
/// still running keeps the mount busy at the unmount that follows (it failed a CI
/// run: "target is busy").
const GIT: &str = "git -c user.name=ubtrfs -c user.email=ubtrfs@example.com \
                   -c gc.auto=0 -c maintenance.auto=false";

/// `git clone` of this repository into the mount, `git fsck --full`, a clean
/// `git status`, a commit made inside the mount, `git gc`, and fsck again.
#[test]
fn tools_git_clone_commit_gc() {
    if !require_fuse("tools_git_clone_commit_gc") {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = source_repo(dir.path());
    let img = fresh_image(dir.path());
    let out = on_ubtrfs(
        &img,
        &format!(
            "git clone -q --no-hardlinks {src} repo
             cd repo
             git fsck --full --no-dangling --no-progress
             test -z \"$(git status --porcelain)\"
             echo 'made inside the mount' > ubtrfs-mount-note.txt
             echo more >> README.md
             git add -A
             {GIT} commit -q -m 'inside the ubtrfs mount'
             git gc -q
             git fsck --full --no-dangling --no-progress --strict
             test -z \"$(git status --porcelain)\"
             git log --oneline | wc -l",
            src = shell_quote(&repo)
        ),
        "git clone, commit, gc",
    );
    let commits: u64 = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("commit count: {out}"));
    took("git clone + fsck + commit + gc + round trip", t0);

    // The kernel commits too; ubtrfs checks out older trees and back, and fscks.
    let t1 = Instant::now();
    kernel_writes(
        &img,
        &format!("cd repo && git fsck --full --no-dangling --no-progress && {GIT} commit -q --allow-empty -m kernel"),
        "git",
    );
    let out = on_ubtrfs(
        &img,
        "cd repo
         git fsck --full --no-dangling --no-progress
         git checkout -q HEAD~2
         git checkout -q -
         test -z \"$(git status --porcelain)\"
         git log --oneline | wc -l",
        "git after the kernel's commit",
    );
    assert_eq!(
        out.trim().parse::<u64>().expect("commit count"),
        commits + 1,
        "the kernel's commit on top of the clone"
    );
    took("kernel commit + checkout + fsck + round trip", t1);
}

/// A small multi-file C project: built with make and gcc in the mount, run, cleaned
/// and built again (same binary); after the kernel rebuilt it, ubtrfs changes one
/// source file and make rebuilds from the mtimes.
#[test]
fn tools_make_gcc() {
    if !require_fuse("tools_make_gcc") {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let proj = dir.path().join("proj");
    std::fs::create_dir(&proj).expect("mkdir");
    let files: &[(&str, &str)] = &[
        (
            "Makefile",
            "CFLAGS = -O2 -Wall -Werror\nOBJS = main.o util.o sum.o\n\n\
             hello: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n\n\
             %.o: %.c util.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\n\
             clean:\n\trm -f hello $(OBJS)\n",
        ),
        (
            "util.h",
            "int sum_to(int n);\nconst char *greeting(void);\n",
        ),
        (
            "main.c",
            "#include <stdio.h>\n#include \"util.h\"\n\
             int main(void) { printf(\"%s %d\\n\", greeting(), sum_to(100)); return 0; }\n",
        ),
        (
            "util.c",
            "#include \"util.h\"\nconst char *greeting(void) { return \"hello from ubtrfs\"; }\n",
        ),
        (
            "sum.c",
            "#include \"util.h\"\nint sum_to(int n) { int s = 0; for (int i = 1; i <= n; i++) s += i; return s; }\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(proj.join(name), text).expect("write source");
    }
    let img = fresh_image(dir.path());
    let out = on_ubtrfs(
        &img,
        &format!(
            "cp -r {p} proj && cd proj
             make -s -j2
             ./hello
             sha256sum hello > first.sha
             make -s clean
             test ! -e hello && test ! -e main.o
             make -s -j2
             ./hello
             sha256sum -c --quiet first.sha",
            p = shell_quote(&proj)
        ),
        "make",
    );
    assert_eq!(out, "hello from ubtrfs 5050\nhello from ubtrfs 5050\n");
    took("make + run + clean + make + round trip", t0);

    let t1 = Instant::now();
    kernel_writes(
        &img,
        "cd proj && make -s clean && make -s && ./hello",
        "make",
    );
    let out = on_ubtrfs(
        &img,
        "cd proj
         ./hello
         sleep 0.01
         sed -i 's/hello from ubtrfs/rebuilt/' util.c
         make | grep -c -- '-c -o' || true
         ./hello",
        "make after the kernel's build",
    );
    // Only util.o is rebuilt: make saw util.c newer than util.o and nothing else.
    assert_eq!(out, "hello from ubtrfs 5050\n1\nrebuilt 5050\n");
    took("kernel make + incremental make + round trip", t1);
}

/// SQLite in WAL mode (POSIX locks on the database and the -shm file, the -shm
/// file shared through mmap) with concurrent writer processes (each in its own
/// transactions, checkpointing every 20 pages) and two readers: every insert is
/// kept, `PRAGMA integrity_check` says ok, and no reader ever sees fewer rows than
/// it saw before (the readers' snapshots come from the shared -shm index).
#[test]
fn tools_sqlite_wal_concurrent_writers() {
    if !require_fuse("tools_sqlite_wal_concurrent_writers") {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path());
    const WRITERS: u64 = 4;
    const ROWS: u64 = 150;
    let out = on_ubtrfs(
        &img,
        &format!(
            "sqlite3 -bail db 'PRAGMA journal_mode=WAL; \
               CREATE TABLE t(w INTEGER, i INTEGER, pad BLOB, PRIMARY KEY (w, i));'
             pids=
             for w in $(seq 1 {WRITERS}); do
               for i in $(seq 1 {ROWS}); do
                 echo \"INSERT INTO t VALUES ($w, $i, randomblob(200 + $i));\"
               done | sqlite3 -bail -cmd '.timeout 60000' \\
                   -cmd 'PRAGMA wal_autocheckpoint=20' db >/dev/null &
               pids=\"$pids $!\"
             done
             for r in 1 2; do
               for i in $(seq 1 30); do
                 echo 'SELECT count(*) FROM t;'
                 echo '.shell sleep 0.05'
               done | sqlite3 -bail -cmd '.timeout 60000' db > reads$r &
               pids=\"$pids $!\"
             done
             for p in $pids; do wait $p; done
             sort -n -c reads1 && sort -n -c reads2
             test \"$(wc -l < reads1)\" = 30
             sqlite3 db 'PRAGMA integrity_check; SELECT count(*), count(DISTINCT w), sum(i) FROM t; PRAGMA journal_mode;'"
        ),
        "sqlite",
    );
    let sum = WRITERS * ROWS * (ROWS + 1) / 2;
    assert_eq!(
        out,
        format!("wal\nok\n{}|{WRITERS}|{sum}\nwal\n", WRITERS * ROWS),
        "journal mode set, integrity_check, rows, writers, sum of i, journal mode kept"
    );
    took("sqlite WAL, concurrent writers + round trip", t0);

    let t1 = Instant::now();
    kernel_writes(
        &img,
        "sqlite3 -bail db 'INSERT INTO t VALUES (0, 1, NULL); PRAGMA integrity_check;' | grep -qx ok",
        "sqlite",
    );
    let out = on_ubtrfs(
        &img,
        "sqlite3 -bail db 'INSERT INTO t VALUES (0, 2, NULL); PRAGMA integrity_check; SELECT count(*) FROM t;'",
        "sqlite after the kernel's insert",
    );
    assert_eq!(out, format!("ok\n{}\n", WRITERS * ROWS + 2));
    took("kernel insert + insert + round trip", t1);
}

/// flock(2) and fcntl record locks between processes (and within one), each step's
/// result printed: exclusive and shared flocks, NB conflicts, a blocked waiter
/// that gets the lock only after release; F_SETLK conflicts with ranges, F_GETLK
/// naming the holder, the POSIX rule that closing any descriptor drops the
/// process's locks, open file description locks, and F_SETLKW waiting.
const LOCK_SCRIPT: &str = r#"
import errno, fcntl, os, select, struct, time

P = "lockfile"
with open(P, "wb") as f:
    f.write(b"x" * 8192)

def res(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]

def flock_struct(typ, start, length):
    return struct.pack("hhqqi4x", typ, os.SEEK_SET, start, length, 0)

def setlk(fd, typ, start, length, cmd=fcntl.F_SETLK):
    return res(lambda: fcntl.fcntl(fd, cmd, flock_struct(typ, start, length)))

def getlk(fd, typ, start, length, parent):
    t, _, s, l, pid = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, flock_struct(typ, start, length)))
    name = {fcntl.F_RDLCK: "RD", fcntl.F_WRLCK: "WR", fcntl.F_UNLCK: "UN"}[t]
    who = "parent" if pid == parent else ("none" if pid == 0 else "other")
    return f"{name} {s} {l} {who}"

def child(fn):
    # Runs fn(fd) in a child process with its own open file description.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        fd = os.open(P, os.O_RDWR)
        os.write(w, fn(fd).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()

def blocked_child(fn, release):
    # fn(fd) blocks in a child until `release` runs here: it must not get the lock
    # before.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        fd = os.open(P, os.O_RDWR)
        os.write(w, b"start|")
        os.write(w, fn(fd).encode())
        os._exit(0)
    os.close(w)
    assert os.read(r, 6) == b"start|"
    time.sleep(0.3)
    early = select.select([r], [], [], 0)[0]
    release()
    data = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return ("got it early: " if early else "waited, then ") + data

me = os.getpid()
a = os.open(P, os.O_RDWR)
out = []
def say(*x):
    out.append(" ".join(str(v) for v in x))

# flock(2)
say("flock EX", res(lambda: fcntl.flock(a, fcntl.LOCK_EX)))
say("child EX|NB", child(lambda fd: res(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))))
say("child SH|NB", child(lambda fd: res(lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))))
b = os.open(P, os.O_RDWR)
say("same process, other open, EX|NB", res(lambda: fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)))
say("child posix WR while flocked", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 0, 0)))
say("child blocking EX", blocked_child(lambda fd: res(lambda: fcntl.flock(fd, fcntl.LOCK_EX)),
                                       lambda: fcntl.flock(a, fcntl.LOCK_UN)))
say("flock SH", res(lambda: fcntl.flock(a, fcntl.LOCK_SH)))
say("child SH|NB", child(lambda fd: res(lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))))
say("child EX|NB", child(lambda fd: res(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))))
say("upgrade to EX|NB", res(lambda: fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)))
say("unlock", res(lambda: fcntl.flock(a, fcntl.LOCK_UN)))
say("child EX|NB", child(lambda fd: res(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))))

# fcntl record locks (process-associated)
say("WR 0+100", setlk(a, fcntl.F_WRLCK, 0, 100))
say("child WR 50+100", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 50, 100)))
say("child RD 50+10", child(lambda fd: setlk(fd, fcntl.F_RDLCK, 50, 10)))
say("child RD 100+100", child(lambda fd: setlk(fd, fcntl.F_RDLCK, 100, 100)))
say("child GETLK WR 0+200", child(lambda fd: getlk(fd, fcntl.F_WRLCK, 0, 200, me)))
say("child GETLK WR 100+100", child(lambda fd: getlk(fd, fcntl.F_WRLCK, 100, 100, me)))
say("same process WR 0+1000 over its own", setlk(a, fcntl.F_WRLCK, 0, 1000))
say("unlock 0+50", setlk(a, fcntl.F_UNLCK, 0, 50))
say("child GETLK WR 0+2000", child(lambda fd: getlk(fd, fcntl.F_WRLCK, 0, 2000, me)))
say("child WR 0+50", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 0, 50)))
say("child WR 40+20", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 40, 20)))
say("RD 2000+0 (to EOF and beyond)", setlk(a, fcntl.F_RDLCK, 2000, 0))
say("child RD 5000+10", child(lambda fd: setlk(fd, fcntl.F_RDLCK, 5000, 10)))
say("child WR 100000+1", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 100000, 1)))
os.close(b)  # closing any descriptor of the file drops all this process's locks
say("after close of another fd, child WR 0+0", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 0, 0)))
say("WR 0+10", setlk(a, fcntl.F_WRLCK, 0, 10))
say("child SETLKW WR 0+10", blocked_child(lambda fd: setlk(fd, fcntl.F_WRLCK, 0, 10, fcntl.F_SETLKW),
                                           lambda: setlk(a, fcntl.F_UNLCK, 0, 10)))

# open file description locks
say("OFD WR 0+10", setlk(a, fcntl.F_WRLCK, 0, 10, fcntl.F_OFD_SETLK))
c = os.open(P, os.O_RDWR)
say("same process, other open, OFD WR 5+1", setlk(c, fcntl.F_WRLCK, 5, 1, fcntl.F_OFD_SETLK))
say("child posix RD 0+1", child(lambda fd: setlk(fd, fcntl.F_RDLCK, 0, 1)))
os.close(c)
say("OFD lock kept after close of another fd; child WR 9+1", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 9, 1)))
say("child OFD WR 10+10", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 10, 10, fcntl.F_OFD_SETLK)))
os.close(a)
say("after close, child OFD WR 0+0", child(lambda fd: setlk(fd, fcntl.F_WRLCK, 0, 0, fcntl.F_OFD_SETLK)))
print("\n".join(out))
"#;

/// What the lock script prints on a kernel btrfs mount (checked against the
/// kernel in the same run, too).
const LOCK_EXPECTED: &str = "\
flock EX ok
child EX|NB EAGAIN
child SH|NB EAGAIN
same process, other open, EX|NB EAGAIN
child posix WR while flocked ok
child blocking EX waited, then ok
flock SH ok
child SH|NB ok
child EX|NB EAGAIN
upgrade to EX|NB ok
unlock ok
child EX|NB ok
WR 0+100 ok
child WR 50+100 EAGAIN
child RD 50+10 EAGAIN
child RD 100+100 ok
child GETLK WR 0+200 WR 0 100 parent
child GETLK WR 100+100 UN 100 100 none
same process WR 0+1000 over its own ok
unlock 0+50 ok
child GETLK WR 0+2000 WR 50 950 parent
child WR 0+50 ok
child WR 40+20 EAGAIN
RD 2000+0 (to EOF and beyond) ok
child RD 5000+10 ok
child WR 100000+1 EAGAIN
after close of another fd, child WR 0+0 ok
WR 0+10 ok
child SETLKW WR 0+10 waited, then ok
OFD WR 0+10 ok
same process, other open, OFD WR 5+1 EAGAIN
child posix RD 0+1 EAGAIN
OFD lock kept after close of another fd; child WR 9+1 EAGAIN
child OFD WR 10+10 ok
after close, child OFD WR 0+0 ok
";

/// The lock script on a kernel btrfs mount and on a ubtrfs mount, in the same run:
/// the same results, and the ones expected.
#[test]
fn tools_locks_match_kernel() {
    if !require_fuse("tools_locks_match_kernel") {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("locks.py");
    std::fs::write(&script, LOCK_SCRIPT).expect("write script");
    let run = format!("python3 {}", shell_quote(&script));

    let kimg = dir.path().join("k.img");
    mkfs_btrfs(&kimg, 1 << 30, &[]);
    let k = KernelMount::new(&kimg, "rw");
    let kernel = bash_ok(&k.mnt, &run).unwrap_or_else(|e| panic!("locks on the kernel: {e}"));
    k.umount();

    let img = fresh_image(dir.path());
    let fuse = on_ubtrfs(&img, &run, "locks");
    assert_eq!(
        fuse, kernel,
        "lock results: ubtrfs mount (left) vs kernel mount"
    );
    assert_eq!(kernel, LOCK_EXPECTED, "lock results on the kernel");
    took("locks on the kernel and on ubtrfs + round trip", t0);
}

/// The label, as `btrfs filesystem label` shows and sets it: on an image (read by
/// btrfs-progs after ubtrfs set it, and the other way), through a directory of the
/// read-write mount (FS_IOC_SETFSLABEL from xfs_io and from `ubtrfs filesystem
/// label`, read by the kernel after the unmount), and through a kernel mount.
#[test]
fn filesystem_label_on_image_and_mounts() {
    if !require_fuse("filesystem_label_on_image_and_mounts") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("a.img");
    mkfs_btrfs(&img, 1 << 30, &["-L", "made by mkfs"]);
    let progs = |img: &Path| {
        bash_ok(
            Path::new("/"),
            &format!("btrfs filesystem label {}", shell_quote(img)),
        )
        .unwrap_or_else(|e| panic!("btrfs filesystem label: {e}"))
    };
    let label_arg = img.to_str().expect("utf-8 path");
    assert_eq!(
        UBTRFS.stdout(&["filesystem", "label", label_arg]),
        progs(&img)
    );
    UBTRFS.stdout(&["filesystem", "label", label_arg, "set offline"]);
    assert_eq!(progs(&img), "set offline\n");
    let long = "x".repeat(256);
    let (ok, _, err) = UBTRFS.run(&["filesystem", "label", label_arg, long.as_str()]);
    assert!(!ok && err.contains("too long"), "{err}");
    bash_ok(
        Path::new("/"),
        &format!(
            "btrfs filesystem label {} 'set by progs'",
            shell_quote(&img)
        ),
    )
    .expect("btrfs-progs sets the label");
    assert_eq!(
        UBTRFS.stdout(&["filesystem", "label", label_arg]),
        "set by progs\n"
    );

    let fm = FuseMount::start(&UBTRFS, &[&img], &["rw"]);
    let mnt = fm.mnt.to_str().expect("utf-8 path").to_string();
    assert_eq!(
        UBTRFS.stdout(&["filesystem", "label", mnt.as_str()]),
        "set by progs\n"
    );
    let out = bash_ok(
        &fm.mnt,
        "xfs_io -c 'label -s via-xfs_io' . && xfs_io -c label .",
    )
    .unwrap_or_else(|e| panic!("xfs_io label: {e}\n{}", fm.log()));
    assert_eq!(out, "label = \"via-xfs_io\"\nlabel = \"via-xfs_io\"\n");
    UBTRFS.stdout(&["filesystem", "label", mnt.as_str(), "on the mount"]);
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&img, &seen, "label");
    assert_eq!(progs(&img), "on the mount\n");

    let km = ubtrfs_sim::mount::KernelMount::new(&img, "");
    let kmnt = km.mnt.to_str().expect("utf-8 path").to_string();
    assert_eq!(
        UBTRFS.stdout(&["filesystem", "label", kmnt.as_str()]),
        "on the mount\n"
    );
    UBTRFS.stdout(&["filesystem", "label", kmnt.as_str(), "kernel mount"]);
    km.umount();
    assert_eq!(
        UBTRFS.stdout(&["filesystem", "label", label_arg]),
        "kernel mount\n"
    );
}

/// fstrim on the read-write mount (FITRIM): the same image, trimmed by the kernel's
/// btrfs on a loop mount and by ubtrfs, reports the same bytes (free extents of each
/// block group once per copy, and the unallocated space); the ubtrfs image gives the
/// host back what was deleted (holes punched), keeps every file, and passes the
/// kernel round trip.
#[test]
fn fstrim_matches_kernel() {
    if !require_fuse("fstrim_matches_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let img = fresh_image(dir.path());
    let km = ubtrfs_sim::mount::KernelMount::new(&img, "");
    bash_ok(
        &km.mnt,
        "head -c 60M /dev/urandom > gone; head -c 20M /dev/urandom > kept
         mkdir d; for i in $(seq 300); do echo $i > d/$i; done
         sync; rm gone",
    )
    .expect("kernel workload");
    km.umount();
    // A sparse copy of the image, named `name`, in the test's directory.
    let copy_of_img = |name: &str| -> PathBuf {
        let to = dir.path().join(name);
        bash_ok(
            dir.path(),
            &format!(
                "cp --sparse=always {} {}",
                shell_quote(&img),
                shell_quote(&to)
            ),
        )
        .expect("copy");
        to
    };
    let kimg = copy_of_img("k.img");
    let km = ubtrfs_sim::mount::KernelMount::new(&kimg, "");
    let kernel = ubtrfs_sim::host::fstrim_bytes(
        &bash_ok(&km.mnt, "fstrim -v .").expect("fstrim on the kernel"),
    );
    km.umount();

    let allocated = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.blocks() * 512)
            .expect("stat")
    };
    // Offline, on another copy: the same figure, printed as fstrim -v prints it.
    let oimg = copy_of_img("o.img");
    let o_before = allocated(&oimg);
    let out = UBTRFS.stdout(&["filesystem", "trim", "-v", oimg.to_str().expect("utf-8")]);
    assert_eq!(
        ubtrfs_sim::host::fstrim_bytes(&out),
        kernel,
        "bytes trimmed offline, kernel: {out}"
    );
    assert!(
        allocated(&oimg) + (50 << 20) < o_before,
        "offline trim punched no holes"
    );
    btrfs_check(&oimg, None).unwrap_or_else(|e| panic!("btrfs check after the offline trim: {e}"));
    let before = allocated(&img);
    let fm = FuseMount::start(&UBTRFS, &[&img], &["rw"]);
    let out = bash_ok(&fm.mnt, "fstrim -v .")
        .unwrap_or_else(|e| panic!("fstrim on ubtrfs: {e}\n{}", fm.log()));
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&img, &seen, "fstrim");
    assert_eq!(
        ubtrfs_sim::host::fstrim_bytes(&out),
        kernel,
        "bytes trimmed: ubtrfs, kernel"
    );
    let after = allocated(&img);
    assert!(
        after + (50 << 20) < before,
        "image still allocates {after} bytes (was {before})"
    );
}

/// overlayfs with its upper and work directories on the read-write mount, as on a
/// kernel btrfs: a file created, one from the lower layer deleted (a whiteout made
/// with RENAME_WHITEOUT), one copied up and changed, a directory made opaque; the
/// merged view and the upper layer (modes, types, device numbers, contents) match
/// the same steps on a kernel btrfs loop mount.
#[test]
fn overlayfs_upper_layer_like_the_kernel() {
    if !require_fuse("overlayfs_upper_layer_like_the_kernel") {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let lower = dir.path().join("lower");
    bash_ok(
        dir.path(),
        "mkdir -p lower/d lower/e && echo a > lower/a && echo b > lower/b && echo c > lower/d/c
         echo f > lower/e/f",
    )
    .expect("lower layer");
    // Runs the steps with upper/work on `base`; prints what an observer compares.
    let run = |base: &Path| -> String {
        let merged = dir.path().join("merged");
        let script = format!(
            "mkdir -p {base}/upper {base}/work {merged}
             mount -t overlay overlay -o lowerdir={lower},upperdir={base}/upper,workdir={base}/work {merged}
             cd {merged}
             echo new > n; rm a; echo more >> b; rm -r e; mkdir e; echo g > e/g
             ls -la --time-style=+ . e | awk '{{print $1, $2, $5, $NF}}'
             cat b e/g
             cd /
             umount {merged}
             cd {base}/upper
             find . -printf '%p %y %m %n %s\\n' | sort
             stat -c '%n %t:%T' a
             getfattr -d -m - --absolute-names e 2>/dev/null | grep -v '^$' || true",
            base = shell_quote(base),
            merged = shell_quote(&merged),
            lower = shell_quote(&lower),
        );
        bash_ok(dir.path(), &script)
            .unwrap_or_else(|e| panic!("overlay on {}: {e}", base.display()))
    };
    let kimg = dir.path().join("k.img");
    mkfs_btrfs(&kimg, 1 << 30, &[]);
    let km = ubtrfs_sim::mount::KernelMount::new(&kimg, "");
    let want = run(&km.mnt);
    km.umount();
    let uimg = fresh_image(dir.path());
    let fm = FuseMount::start(&UBTRFS, &[&uimg], &["rw"]);
    let got = run(&fm.mnt);
    let seen = fm.walk_and_unmount();
    kernel_round_trip(&uimg, &seen, "overlayfs upper layer");
    assert_eq!(
        got, want,
        "overlayfs on ubtrfs (left) and on the kernel's btrfs (right)"
    );
    assert!(
        want.contains("./a c 0 "),
        "no whiteout in the upper layer:\n{want}"
    );
}
