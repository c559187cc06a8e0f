import ctypes, errno, fcntl, os, struct, subprocess, sys

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IOC_FSGETXATTR = 0x801C581F
FS_IOC_FSSETXATTR = 0x401C5820
NOBODY = 65534
libc = ctypes.CDLL(None, use_errno=True)


def name_of(e):
    return errno.errorcode.get(e, str(e))


def step(label, fn, uid=None):
    if uid is None:
        try:
            r = fn()
            out = "OK" if r is None else "OK %s" % (r,)
        except OSError as e:
            out = name_of(e.errno)
    else:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                fn()
            except OSError as e:
                code = e.errno
            except BaseException:
                code = 255
            os._exit(code)
        _, st = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(st)
        out = "OK" if code == 0 else name_of(code)
    print("%s: %s" % (label, out), flush=True)


def getflags(p):
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        b = fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 8)
        return struct.unpack("i", b[:4])[0]
    finally:
        os.close(fd)


def setflags(p, v):
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", v))
    finally:
        os.close(fd)


def fsxattr(p, xflags=None, extsize=0):
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        b = fcntl.ioctl(fd, FS_IOC_FSGETXATTR, b"\0" * 28)
        if xflags is None:
            return hex(struct.unpack("I", b[:4])[0])
        fcntl.ioctl(fd, FS_IOC_FSSETXATTR, struct.pack("IIIII8s", xflags, extsize, 0, 0, 0, b""))
    finally:
        os.close(fd)


def chattr(args, p):
    r = subprocess.run(["chattr", args, p], capture_output=True)
    return r.returncode


def lsattr(p):
    r = subprocess.run(["lsattr", "-d", p], capture_output=True, text=True)
    return (r.stdout + r.stderr).strip()


def getprop(p):
    try:
        return os.getxattr(p, "btrfs.compression", follow_symlinks=False).decode()
    except OSError as e:
        return name_of(e.errno)


def openclose(p, flags):
    os.close(os.open(p, flags, 0o644))


def write_at(p, flags, data=b"more"):
    fd = os.open(p, flags)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def fallocate(p, flags, mode, off, ln):
    fd = os.open(p, flags)
    try:
        if libc.fallocate(fd, mode, ctypes.c_long(off), ctypes.c_long(ln)) != 0:
            raise OSError(ctypes.get_errno(), "fallocate")
    finally:
        os.close(fd)


def libc_exchange(a, b):
    # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def show(p):
    print("  lsattr %s" % lsattr(p), flush=True)
    print("  prop %s: %s" % (p, getprop(p)), flush=True)


# The same sequence, run by crates/cli/tests/mount_attr.rs as root in the root of a
# kernel btrfs mount and of a ubtrfs mount: one line per step, "OK" or the errno
# name, plus lsattr output and the btrfs.compression property where it matters.
# With the argument "options", a short sequence for mounts with compress options.
TEXT = b"".join(b"line %06d of some very compressible text\n" % i for i in range(25000))

if sys.argv[1:] == ["options"]:
    os.mkdir("o")
    os.chdir("o")
    for n in ["plain", "m", "c", "prop"]:
        open(n, "wb").close()
    step("chattr +m m", lambda: chattr("+m", "m"))
    step("chattr +c c", lambda: chattr("+c", "c"))
    step("setprop prop zlib", lambda: os.setxattr("prop", "btrfs.compression", b"zlib"))
    for n in ["plain", "m", "c", "prop"]:
        with open(n, "ab") as f:
            f.write(TEXT)
        show(n)
    os.sync()
    sys.exit(0)

os.mkdir("w")
os.chmod("w", 0o777)
os.chdir("w")
for n in ["f", "imm", "app", "late", "u", "imm666", "data", "nocow", "cfile", "pz", "pm"]:
    with open(n, "wb") as f:
        f.write(b"hello\n" if n not in ("nocow", "cfile", "pz", "pm", "data") else b"")
for d in ["dimm", "dapp", "dc", "dnocow", "dz", "dnone"]:
    os.mkdir(d)
    os.chmod(d, 0o777)
    with open(d + "/x", "wb") as f:
        f.write(b"x\n")
os.chown("u", NOBODY, NOBODY)
os.chmod("imm666", 0o666)
# On disk before any flag changes: the kernel would otherwise write (and compress)
# this data only at writeback, after the flags below.
os.sync()

# immutable file
step("chattr +i imm", lambda: chattr("+i", "imm"))
show("imm")
step("imm open wronly", lambda: openclose("imm", os.O_WRONLY))
step("imm open rdonly", lambda: openclose("imm", os.O_RDONLY))
step("imm open append", lambda: openclose("imm", os.O_WRONLY | os.O_APPEND))
step("imm open trunc", lambda: openclose("imm", os.O_RDONLY | os.O_TRUNC))
step("imm truncate", lambda: os.truncate("imm", 0))
step("imm chmod", lambda: os.chmod("imm", 0o600))
step("imm chown", lambda: os.chown("imm", 1, 1))
step("imm utime set", lambda: os.utime("imm", (1, 2)))
step("imm utime now", lambda: os.utime("imm", None))
step("imm link", lambda: os.link("imm", "imm.link"))
step("imm unlink", lambda: os.unlink("imm"))
step("imm rename", lambda: os.rename("imm", "imm2"))
step("imm rename over", lambda: os.rename("f", "imm"))
step("imm setxattr", lambda: os.setxattr("imm", "user.a", b"1"))
step("imm removexattr", lambda: os.removexattr("imm", "user.a"))
step("imm setprop", lambda: os.setxattr("imm", "btrfs.compression", b"zstd"))
step("imm read", lambda: len(open("imm", "rb").read()))
step("chattr +i imm666", lambda: chattr("+i", "imm666"))
step("nobody imm666 open wronly", lambda: openclose("imm666", os.O_WRONLY), NOBODY)
step("nobody imm666 unlink", lambda: os.unlink("imm666"), NOBODY)
step("nobody imm666 setflags", lambda: setflags("imm666", 0), NOBODY)

# a file made immutable / append-only while open
fd = os.open("late", os.O_WRONLY)
step("chattr +i late", lambda: chattr("+i", "late"))
step("late write open fd", lambda: os.write(fd, b"x"))
step("late ftruncate open fd", lambda: os.ftruncate(fd, 0))
os.close(fd)
step("chattr -i late", lambda: chattr("-i", "late"))

# append-only file
step("chattr +a app", lambda: chattr("+a", "app"))
show("app")
step("app open wronly", lambda: openclose("app", os.O_WRONLY))
step("app open rdwr", lambda: openclose("app", os.O_RDWR))
step("app open append", lambda: openclose("app", os.O_WRONLY | os.O_APPEND))
step("app open append trunc", lambda: openclose("app", os.O_WRONLY | os.O_APPEND | os.O_TRUNC))
step("app append write", lambda: write_at("app", os.O_WRONLY | os.O_APPEND))
step("app truncate", lambda: os.truncate("app", 0))
step("app chmod", lambda: os.chmod("app", 0o600))
step("app utime set", lambda: os.utime("app", (1, 2)))
step("app utime now", lambda: os.utime("app", None))
step("app link", lambda: os.link("app", "app.link"))
step("app unlink", lambda: os.unlink("app"))
step("app rename", lambda: os.rename("app", "app2"))
step("app setxattr", lambda: os.setxattr("app", "user.a", b"1"))
step("app fallocate", lambda: fallocate("app", os.O_WRONLY | os.O_APPEND, 0, 0, 8192))
step("app punch", lambda: fallocate("app", os.O_WRONLY | os.O_APPEND, 3, 0, 4096))
step("app content", lambda: repr(open("app", "rb").read().rstrip(b"\0")) + " size %d" % os.stat("app").st_size)

# immutable directory
step("chattr +i dimm", lambda: chattr("+i", "dimm"))
show("dimm")
step("dimm create", lambda: openclose("dimm/new", os.O_WRONLY | os.O_CREAT))
step("dimm mkdir", lambda: os.mkdir("dimm/sub"))
step("dimm symlink", lambda: os.symlink("x", "dimm/sym"))
step("dimm mknod", lambda: os.mkfifo("dimm/fifo"))
step("dimm link in", lambda: os.link("f", "dimm/f"))
step("dimm unlink", lambda: os.unlink("dimm/x"))
step("dimm rename out", lambda: os.rename("dimm/x", "x.out"))
step("dimm rename in", lambda: os.rename("f", "dimm/f"))
step("dimm write child", lambda: write_at("dimm/x", os.O_WRONLY))
step("dimm list", lambda: ",".join(sorted(os.listdir("dimm"))))
step("dimm chmod", lambda: os.chmod("dimm", 0o755))
step("nobody dimm create", lambda: openclose("dimm/n", os.O_WRONLY | os.O_CREAT), NOBODY)

# append-only directory
step("chattr +a dapp", lambda: chattr("+a", "dapp"))
step("dapp create", lambda: openclose("dapp/new", os.O_WRONLY | os.O_CREAT))
step("dapp mkdir", lambda: os.mkdir("dapp/sub"))
step("dapp unlink", lambda: os.unlink("dapp/x"))
step("dapp rmdir", lambda: os.rmdir("dapp/sub"))
step("dapp rename out", lambda: os.rename("dapp/x", "x.out"))
step("dapp rename within", lambda: os.rename("dapp/new", "dapp/new2"))
step("dapp rename in", lambda: os.rename("late", "dapp/late"))
step("dapp rename over", lambda: os.rename("data", "dapp/x"))
step("dapp list", lambda: ",".join(sorted(os.listdir("dapp"))))

# who may change flags
step("nobody setflags root file", lambda: setflags("f", 0x40), NOBODY)
step("nobody setflags +d own", lambda: setflags("u", 0x40), NOBODY)
step("nobody setflags +i own", lambda: setflags("u", 0x40 | 0x10), NOBODY)
step("nobody setflags +a own", lambda: setflags("u", 0x40 | 0x20), NOBODY)
step("nobody setflags +c own", lambda: setflags("u", 0x40 | 0x4), NOBODY)
show("u")
step("nobody setprop own", lambda: os.setxattr("u", "btrfs.compression", b"lzo"), NOBODY)
step("nobody setprop root file", lambda: os.setxattr("f", "btrfs.compression", b"lzo"), NOBODY)
show("u")

# flag rules
step("setflags extent", lambda: setflags("f", 0x80000))
step("setflags c+m", lambda: setflags("f", 0x4 | 0x400))
step("setflags c+C", lambda: setflags("f", 0x4 | 0x800000))
step("setflags D on file", lambda: setflags("f", 0x10000))
show("f")
step("setflags SAd", lambda: setflags("f", 0x8 | 0x80 | 0x40))
show("f")
step("getflags f", lambda: hex(getflags("f")))
step("fsgetxattr f", lambda: fsxattr("f"))
step("fssetxattr f sync", lambda: fsxattr("f", 0x20))
show("f")
step("fssetxattr f extsize", lambda: fsxattr("f", 0x20, 4096))
step("fssetxattr f realtime", lambda: fsxattr("f", 0x1))
step("chattr +C with data", lambda: chattr("+C", "f"))
show("f")
step("chattr +C empty", lambda: chattr("+C", "nocow"))
show("nocow")
step("nocow +c", lambda: setflags("nocow", getflags("nocow") | 0x4))
step("nocow setprop", lambda: os.setxattr("nocow", "btrfs.compression", b"zstd"))
step("chattr -C empty", lambda: chattr("-C", "nocow"))
show("nocow")
step("chattr +C empty again", lambda: chattr("+C", "nocow"))
step("chattr +m nocow", lambda: chattr("+m", "nocow"))
step("chattr +D dir", lambda: chattr("+D", "dc"))
step("chattr +S dir", lambda: chattr("+S", "dc"))
step("chattr +c dir", lambda: chattr("+c", "dc"))
show("dc")
step("chattr +C dir", lambda: chattr("+C", "dnocow"))
show("dnocow")
step("chattr +m +c", lambda: chattr("+m", "pm"))
show("pm")
step("chattr +c cfile", lambda: chattr("+c", "cfile"))
show("cfile")

# the compression property
step("setprop zstd", lambda: os.setxattr("pz", "btrfs.compression", b"zstd"))
show("pz")
step("setprop gzip", lambda: os.setxattr("pz", "btrfs.compression", b"gzip"))
step("setprop zstd:5", lambda: os.setxattr("pz", "btrfs.compression", b"zstd:5"))
show("pz")
step("setprop none", lambda: os.setxattr("data", "btrfs.compression", b"none"))
show("data")
step("setprop no", lambda: os.setxattr("data", "btrfs.compression", b"no"))
show("data")
step("setprop empty", lambda: os.setxattr("data", "btrfs.compression", b""))
show("data")
step("removeprop absent", lambda: os.removexattr("data", "btrfs.compression"))
step("setprop lzo", lambda: os.setxattr("data", "btrfs.compression", b"lzo"))
step("removeprop", lambda: os.removexattr("data", "btrfs.compression"))
show("data")
step("setprop unknown", lambda: os.setxattr("data", "btrfs.foo", b"zstd"))
step("setprop create exists", lambda: (os.setxattr("data", "btrfs.compression", b"zlib"), os.setxattr("data", "btrfs.compression", b"zstd", os.XATTR_CREATE)))
step("setprop replace absent", lambda: os.setxattr("pm", "btrfs.compression", b"zstd", os.XATTR_REPLACE))
os.symlink("data", "sym")
step("setprop symlink", lambda: os.setxattr("sym", "btrfs.compression", b"zstd", follow_symlinks=False))
step("getprop symlink", lambda: getprop("sym"))
step("chattr +d on zstd file", lambda: chattr("+d", "pz"))
show("pz")
step("setprop dz zstd:7", lambda: os.setxattr("dz", "btrfs.compression", b"zstd:7"))
step("setprop dnone none", lambda: os.setxattr("dnone", "btrfs.compression", b"none"))

# inheritance
for d in ["dc", "dnocow", "dz", "dnone"]:
    with open(d + "/child", "wb") as f:
        f.write(TEXT)
    os.mkdir(d + "/sub")
    with open(d + "/sub/grandchild", "wb") as f:
        f.write(TEXT)
    os.symlink("child", d + "/link")
    for p in [d + "/child", d + "/sub", d + "/sub/grandchild"]:
        show(p)

# setuid and setgid dropped by changes, as the VFS drops them: for callers without
# CAP_FSETID, setgid only when the group may execute or the caller is outside the
# file's group; chown always drops setuid (ubtrfs: FUSE_HANDLE_KILLPRIV_V2, the
# server clears them and tells the kernel to forget the cached mode).
with open("ssrc", "wb") as f:
    f.write(b"source\n")


def copy_range(dst):
    fi = os.open("ssrc", os.O_RDONLY)
    fo = os.open(dst, os.O_WRONLY)
    try:
        os.copy_file_range(fi, fo, 4, 0, 0)
    finally:
        os.close(fi)
        os.close(fo)


KILL_ACTIONS = [
    ("write", lambda p: write_at(p, os.O_WRONLY)),
    ("truncate", lambda p: os.truncate(p, 2)),
    ("fallocate", lambda p: fallocate(p, os.O_WRONLY, 0, 0, 8192)),
    ("punch", lambda p: fallocate(p, os.O_WRONLY, 3, 0, 4096)),
    ("copy_file_range", copy_range),
    ("chown", lambda p: os.chown(p, -1, os.getgid())),
]
n = 0
for mode in (0o6755, 0o6745, 0o2755):
    for group in (NOBODY, 0):
        for caller in (None, NOBODY):
            for name, act in KILL_ACTIONS:
                n += 1
                p = "s%d" % n
                with open(p, "wb") as f:
                    f.write(b"hello\n")
                os.chown(p, NOBODY, group)
                os.chmod(p, mode)
                who = "root" if caller is None else "nobody"
                step("%s %o group %d by %s" % (name, mode, group, who), lambda: act(p), caller)
                step("  mode", lambda: oct(os.stat(p).st_mode & 0o7777))

# `..` of a directory moved to another parent, as READDIR lists it (getdents64: `ls -i`
# stats `..` instead): the new parent's inode number.
def dotdot_is(d, parent):
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    buf = ctypes.create_string_buffer(65536)
    try:
        while True:
            n = libc.syscall(217, fd, buf, 65536)  # SYS_getdents64 (x86-64)
            if n <= 0:
                return None
            off = 0
            while off < n:
                ino, _, reclen, _ = struct.unpack_from("<QqHB", buf.raw, off)
                name = buf.raw[off + 19 : off + reclen].split(b"\0", 1)[0]
                if name == b"..":
                    return ino == os.stat(parent).st_ino
                off += reclen
    finally:
        os.close(fd)


os.makedirs("mv_a/d/e")
os.makedirs("mv_b")
step("ls before the move", lambda: dotdot_is("mv_a/d", "mv_a"))
step("rename mv_a/d mv_b/d", lambda: os.rename("mv_a/d", "mv_b/d"))
step("  .. of mv_b/d is mv_b", lambda: dotdot_is("mv_b/d", "mv_b"))
step("  .. of mv_b/d/e is mv_b/d", lambda: dotdot_is("mv_b/d/e", "mv_b/d"))
os.makedirs("mv_a/x")
step("exchange mv_a/x mv_b/d", lambda: libc_exchange("mv_a/x", "mv_b/d"))
step("  .. of mv_a/x (was mv_b/d) is mv_a", lambda: dotdot_is("mv_a/x", "mv_a"))
step("  .. of mv_b/d (was mv_a/x) is mv_b", lambda: dotdot_is("mv_b/d", "mv_b"))

# The link limit: 65,535 names (BTRFS_LINK_MAX), then EMLINK; removed after.
os.makedirs("links")
open("links/f", "w").close()
for i in range(65534):
    os.link("links/f", "links/l%d" % i)
step("link past 65,535 names", lambda: os.link("links/f", "links/one-more"))
step("  nlink", lambda: os.stat("links/f").st_nlink)
for i in range(65534):
    os.unlink("links/l%d" % i)
step("  link again after unlinking", lambda: os.link("links/f", "links/one-more"))

# data
for n in ["cfile", "pz", "pm", "nocow", "data"]:
    with open(n, "ab") as f:
        f.write(TEXT)
os.sync()
