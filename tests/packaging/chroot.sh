# shellcheck shell=bash
# Debian chroots for the install tests: another distribution's C library (Debian 11: glibc 2.31, GCC 10's
# libstdc++, no gloo or hiredis) or another architecture (Debian 12 arm64, run by qemu-user). Made once with
# debootstrap from Debian's mirror and kept outside the checkout, under ~/.cache/distckpt/chroots/ (DISTCKPT_CACHE),
# named by a hash of what goes into them, so a clone reuses them and a change of packages makes a new one. Sourced.
#
#   dir=$(chroot_make SUITE ARCH VARIANT PACKAGE...)  # e.g. bullseye amd64 minbase python3 python3-venv
#   chroot_run DIR HOSTDIR COMMAND...                 # COMMAND as root inside DIR, HOSTDIR mounted at /work, and
#                                                     # each HOST:INSIDE of the array CHROOT_BINDS mounted too
#   binfmt_aarch64                                    # lets this kernel run arm64 programs through qemu-user-static
#
# chroot_run works in a private mount namespace (unshare): /proc, /dev, a fresh /dev/shm and /tmp, and the bind mount
# of HOSTDIR all vanish with the command, whatever happens to it. The host's network is shared (loopback for Gloo).
# Needs root (debootstrap, chroot, mount); each function prints why it cannot and returns non-zero otherwise.

chroot_cache_dir() { echo "${DISTCKPT_CACHE:-$HOME/.cache/distckpt}/chroots"; }

# chroot_make SUITE ARCH VARIANT PACKAGE...: prints the path of a chroot holding PACKAGEs, making it if needed.
chroot_make() {
  local suite=$1 arch=$2 variant=$3
  shift 3
  local include key dir cache lock
  include=$(printf '%s\n' "$@" | sort -u | paste -sd, -)
  # Bump the last field to rebuild every chroot after a change of how they are made.
  key=$(printf '%s %s %s %s v1' "$suite" "$arch" "$variant" "$include" | sha256sum | cut -c1-12)
  cache=$(chroot_cache_dir)
  dir="$cache/$suite-$arch-$key"
  mkdir -p "$cache" || return 1
  lock="$cache/.lock-$suite-$arch-$key"
  (
    flock 9
    [[ -f $dir/.complete ]] && exit 0
    command -v debootstrap >/dev/null || { echo "chroot_make: debootstrap is missing (scripts/install_deps.sh)" >&2; exit 1; }
    if [[ $arch != "$(dpkg --print-architecture)" ]]; then binfmt_for "$arch" || exit 1; fi
    rm -rf "$dir.tmp"
    local log="$cache/$suite-$arch-$key.log"
    if ! debootstrap --arch="$arch" --variant="$variant" ${include:+--include="$include"} "$suite" "$dir.tmp" \
        http://deb.debian.org/debian >"$log" 2>&1; then
      echo "chroot_make: debootstrap $suite $arch failed (log: $log):" >&2
      tail -5 "$log" >&2
      rm -rf "$dir.tmp"
      exit 1
    fi
    rm -rf "$dir.tmp"/var/cache/apt/archives/*.deb
    touch "$dir.tmp/.complete"
    mv -T "$dir.tmp" "$dir"
  ) 9>"$lock" || return 1
  echo "$dir"
}

# chroot_run DIR HOSTDIR COMMAND...: runs COMMAND in DIR with HOSTDIR at /work (read-write), HOME=/root, and every
# HOST:INSIDE of CHROOT_BINDS (an array, may be unset) bound at INSIDE.
chroot_run() {
  local dir=$1 host=$2
  shift 2
  local binds
  binds=$(printf '%s\n' "${CHROOT_BINDS[@]+"${CHROOT_BINDS[@]}"}")
  unshare --mount --propagation private -- /bin/bash -c '
    set -e
    d=$1 h=$2 binds=$3
    shift 3
    mount -t proc proc "$d/proc"
    mount --rbind /dev "$d/dev"
    mkdir -p "$d/dev/shm" "$d/work"
    mount -t tmpfs tmpfs "$d/dev/shm"
    mount -t tmpfs tmpfs "$d/tmp"
    mount --bind "$h" "$d/work"
    while IFS=: read -r from to; do
      [[ -n $from ]] || continue
      mkdir -p "$d$to"
      mount --bind "$from" "$d$to"
    done <<<"$binds"
    cp /etc/resolv.conf "$d/etc/resolv.conf" 2>/dev/null || true
    exec chroot "$d" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin LANG=C.UTF-8 "$@"
  ' chroot_run "$dir" "$host" "$binds" "$@"
}

# binfmt_for ARCH: makes sure the kernel hands ARCH's ELF files to qemu-user-static (Debian's qemu-user-static ships
# the registrations in /usr/lib/binfmt.d; systemd registers them at boot, which a container does not do).
binfmt_for() {
  local arch=$1 name conf
  case $arch in
    arm64 | aarch64) name=qemu-aarch64 ;;
    *) echo "binfmt_for: no qemu registration known for $arch" >&2; return 1 ;;
  esac
  conf=/usr/lib/binfmt.d/$name.conf
  [[ -f $conf ]] || { echo "binfmt_for: $conf is missing (apt-get install qemu-user-static)" >&2; return 1; }
  if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || {
      echo "binfmt_for: cannot mount binfmt_misc (needs root with CAP_SYS_ADMIN): $arch programs cannot run here" >&2
      return 1
    }
  fi
  if [[ ! -e /proc/sys/fs/binfmt_misc/$name ]]; then
    grep -v '^#' "$conf" | head -1 > /proc/sys/fs/binfmt_misc/register 2>/dev/null || {
      echo "binfmt_for: registering $name with binfmt_misc failed" >&2
      return 1
    }
  fi
  [[ $(head -1 "/proc/sys/fs/binfmt_misc/$name") == enabled ]] || { echo "binfmt_for: $name is disabled" >&2; return 1; }
}
binfmt_aarch64() { binfmt_for arm64; }

# The roots the tests use, one definition each (build_lib.sh links the AArch64 plugin against the arm64 one).
# Debian 11 (glibc 2.31, GCC 10's libstdc++, Python 3.9; no gloo or hiredis): where the portable core, the consumers
# and the cp39 wheel must run. libc6-dev: the consumers are linked against its C library (--sysroot), as a user
# building for older machines does.
chroot_debian11() { chroot_make bullseye amd64 minbase python3 python3-venv libc6-dev; }
# Debian 12 arm64, run by qemu-user: gloo and gtest to link the AArch64 plugin and C++ tests against, Python 3.11
# (with its headers for the cp311 AArch64 wheel) to run the wheel.
chroot_aarch64() { chroot_make bookworm arm64 minbase python3 python3-venv libpython3.11-dev libgloo-dev libgtest-dev libzstd-dev; }

# chroot_possible: whether this machine lets the tests make and enter roots (root, a private mount namespace);
# prints why not. The suites that need roots report SKIPPED with that reason where it does not.
chroot_possible() {
  if [[ $(id -u) -ne 0 ]]; then echo "not root (debootstrap, chroot and mount need root)"; return 1; fi
  if ! unshare --mount --propagation private true 2>/dev/null; then
    echo "no private mount namespace here (unshare --mount fails: the container forbids it)"
    return 1
  fi
  command -v debootstrap >/dev/null || { echo "debootstrap is missing (scripts/install_deps.sh)"; return 1; }
}
