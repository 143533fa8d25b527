#!/bin/sh
# Runs the program built against this soname's first header and the one
# built against the current header; they must print the same lines.
old=$("$1") || exit $?
new=$("$2") || exit $?
printf '%s\n' "$old"
[ "$old" = "$new" ] && exit 0
echo "the current header's program printed otherwise:"
printf '%s\n' "$new"
exit 1
