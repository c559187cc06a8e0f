# Access times, step by step (crates/cli/tests/mount_atime.rs). Runs with bash in
# the root of a fresh mount made with relatime (the default); prints one line per
# step: which of atime, mtime, ctime changed (A, M, C or -). Needs:
#   REMOUNT   a command that remounts this mount with the options in $1
#   SNAPSHOT  a command making a read-only snapshot of the mounted subvolume as $1
set -e
t() { stat -c '%x|%y|%z' "$1"; }
step() {
    local label=$1 p=$2
    shift 2
    local b a b1 b2 b3 a1 a2 a3
    b=$(t "$p")
    sleep 0.05
    "$@" > /dev/null 2>&1 || echo "$label: command failed"
    a=$(t "$p")
    IFS='|' read -r b1 b2 b3 <<< "$b"
    IFS='|' read -r a1 a2 a3 <<< "$a"
    local r=""
    [ "$a1" != "$b1" ] && r+=A || r+=-
    [ "$a2" != "$b2" ] && r+=M || r+=-
    [ "$a3" != "$b3" ] && r+=C || r+=-
    echo "$label: $r"
}
noatime_list() {
    python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_DIRECTORY|os.O_NOATIME); list(os.scandir(fd))' "$1"
}
noatime_read() {
    python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_NOATIME); os.read(fd, 100)' "$1"
}

echo aaa > f
mkdir d
echo x > d/g
ln -s f l
: > empty
echo f2 > f2
echo f4 > f4
echo f5 > f5
echo fi > fi
sleep 0.05

step "read a new file" f cat f
step "read it again" f cat f
step "list a new directory" d ls d
step "list it again" d ls d
step "readlink of a new symlink" l readlink l
step "readlink again" l readlink l
step "open with O_NOATIME and read" f5 noatime_read f5
step "read after that" f5 cat f5
step "append" f sh -c 'echo more >> f'
step "read after the append" f cat f
step "read an empty file" empty cat empty
step "stat only" f2 stat f2
step "open and close only" f2 sh -c 'exec 3< f2'
chattr +A f2
step "read a file with the A flag" f2 cat f2
chattr -A f2
step "read it without the flag" f2 cat f2
chattr +i fi
step "read an immutable file" fi cat fi
chattr -i fi
step "new entry in the directory" d touch d/new
step "look a name up in it" d stat d/g
step "list it with O_NOATIME" d noatime_list d
step "list it after that" d ls d

eval "$REMOUNT strictatime"
step "strictatime: read" f cat f
step "strictatime: read again" f cat f
step "strictatime: list" d ls d
step "strictatime: list again" d ls d
step "strictatime: readlink" l readlink l
step "strictatime: readlink again" l readlink l
step "strictatime: follow the link" l cat l

eval "$REMOUNT nodiratime"
touch d/new2
step "nodiratime: list a changed directory" d ls d
echo y >> f
step "nodiratime: read a changed file" f cat f

eval "$REMOUNT noatime"
echo f3 > f3
step "noatime: read a new file" f3 cat f3
touch d/new3
step "noatime: list a changed directory" d ls d
ln -s f l2
step "noatime: readlink of a new symlink" l2 readlink l2

# From noatime, mount(8)'s remount,relatime keeps noatime (it lists the mount's
# current options first, and noatime then stays set); strictatime clears it.
eval "$REMOUNT relatime"
step "remount,relatime of a noatime mount: read" f3 cat f3
eval "$REMOUNT strictatime"
eval "$REMOUNT relatime"
step "relatime again: read" f3 cat f3
step "relatime again: list" d ls d

eval "$SNAPSHOT snap"
echo f6 >> f4
step "read-only snapshot: read" snap/f4 cat snap/f4
step "read-only snapshot: list" snap/d ls snap/d
step "live side: read" f4 cat f4

touch f5 d
eval "$REMOUNT ro"
step "read-only mount: read" f5 cat f5
step "read-only mount: list" d ls d
eval "$REMOUNT rw"
step "read-write again: read" f5 cat f5
step "read-write again: list" d ls d
