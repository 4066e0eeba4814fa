#!/bin/sh
# Run inside the image's build (Dockerfile): makes cargo's freshness check follow content.
#
# cargo thinks a workspace crate stale when a source file is newer than its last build. `COPY`
# gives every file the build context's mtime, so each build recompiled all four crates, with
# their outputs kept in the cache mount (target/). `restore` gives each file whose content is
# what the last successful build compiled that build's mtime back (so cargo reuses its
# output), and every other file the time now (so cargo rebuilds it, even from an old checkout
# whose mtimes are older than the cache's outputs). `save` records content and mtime after a
# successful build. `restore` deletes the record first: after a failed build, partly compiled
# outputs may not match it, so nothing is trusted and everything rebuilds.
#
#   image-mtimes.sh restore|save
set -eu
record=target/.image-source-stamps
sources() {
    for p in Cargo.toml Cargo.lock .cargo src crates loadtest config tests; do
        if [ -e "$p" ]; then find "$p" -type f ! -path '*/target/*'; fi
    done | LC_ALL=C sort
}
case "${1:-}" in
restore)
    now=$(date +%s)
    sources | xargs -d '\n' sha256sum >target/.image-source-now
    if [ -f "$record" ]; then
        # record lines: sha256 mtime path; now lines: sha256 path.
        awk -v now="$now" 'NR == FNR { stamp[$3] = $1 " " $2; next }
            { split(stamp[$2], s, " "); print (s[1] == $1 ? s[2] : now), $2 }' \
            "$record" target/.image-source-now
    else
        awk -v now="$now" '{ print now, $2 }' target/.image-source-now
    fi | while read -r mtime path; do touch -m -d "@$mtime" "$path"; done
    rm -f "$record" target/.image-source-now
    ;;
save)
    sources | xargs -d '\n' sha256sum | while read -r sum path; do
        echo "$sum $(stat -c %Y "$path") $path"
    done >"$record.tmp"
    mv "$record.tmp" "$record"
    ;;
*)
    echo "usage: $0 restore|save" >&2
    exit 2
    ;;
esac
