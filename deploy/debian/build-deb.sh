#!/bin/sh
# Builds commtap's Debian package from a built binary: the binary, the systemd unit, the
# Slurm prolog and epilog, manual pages and shell completions (made by the binary itself,
# from the same definitions as --help), a configuration file listing every option, and
# /etc/default/commtap. `cargo xtask package` runs it on the release build; the tests run
# it on theirs.
#
# Usage: build-deb.sh BINARY VERSION OUTDIR [COMPRESSION]   (COMPRESSION: xz, gzip, none)
set -eu
bin=$1 version=$2 out=$3 compression=${4:-xz}
here=$(cd "$(dirname "$0")" && pwd)
deploy=$(dirname "$here")
arch=$(dpkg --print-architecture)
stage="$out/commtap_${version}_${arch}"
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$stage/usr/bin" "$stage/lib/systemd/system" \
    "$stage/etc/commtap" "$stage/etc/default" "$stage/usr/share/commtap/slurm" \
    "$stage/usr/share/man/man1" "$stage/usr/share/doc/commtap" \
    "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
    "$stage/usr/share/fish/vendor_completions.d"

install -m 0755 "$bin" "$stage/usr/bin/commtap"
# Line tables out (a fifth of the size), function names kept for backtraces.
strip --strip-debug "$stage/usr/bin/commtap"
# The unit as shipped in the repository, for the package's paths, reading /etc/default.
sed -e 's|/usr/local/bin/commtap|/usr/bin/commtap|g' \
    -e 's|^# Install: .*||; s|^#          systemctl daemon-reload.*||' \
    -e 's|^ExecStart=|EnvironmentFile=-/etc/default/commtap\nExecStart=|' \
    "$deploy/systemd/commtap.service" > "$stage/lib/systemd/system/commtap.service"
install -m 0755 "$deploy/slurm/prolog.sh" "$stage/usr/share/commtap/slurm/prolog.sh"
install -m 0755 "$deploy/slurm/epilog.sh" "$stage/usr/share/commtap/slurm/epilog.sh"
install -m 0644 "$here/default" "$stage/etc/default/commtap"
# The binary is run only to write files; with no configuration of the build machine's.
run() { COMMTAP_CONFIG=/dev/null "$stage/usr/bin/commtap" "$@"; }
run config --example > "$stage/etc/commtap/commtap.toml"
run man --out "$stage/usr/share/man/man1" 2>/dev/null
gzip -9n "$stage"/usr/share/man/man1/*.1
run completions bash > "$stage/usr/share/bash-completion/completions/commtap"
run completions zsh > "$stage/usr/share/zsh/vendor-completions/_commtap"
run completions fish > "$stage/usr/share/fish/vendor_completions.d/commtap.fish"
install -m 0644 "$here/copyright" "$stage/usr/share/doc/commtap/copyright"

printf '%s\n' /etc/commtap/commtap.toml /etc/default/commtap > "$stage/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$stage/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$version/; s/@ARCH@/$arch/; s/@SIZE@/$size/" "$here/control" \
    > "$stage/DEBIAN/control"
case "$compression" in
    xz) z="-Zxz" ;; gzip) z="-Zgzip" ;; none) z="-Znone" ;;
    *) echo "build-deb.sh: compression xz, gzip or none, not '$compression'" >&2; exit 2 ;;
esac
dpkg-deb --root-owner-group "$z" --build "$stage" "$out/commtap_${version}_${arch}.deb" >&2
rm -rf "$stage"
echo "$out/commtap_${version}_${arch}.deb"
