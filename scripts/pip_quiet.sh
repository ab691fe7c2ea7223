# Sourced by the setup scripts: `pipq ARGS...` runs "$VPY" -m pip quietly, without pip's notes about
# package-index folders that are absent on this machine, and keeps pip's exit status.
pipq() {
  local out rc=0
  out=$("$VPY" -m pip --disable-pip-version-check -q "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e "is ignored: it is neither a file nor a directory" -e '^$' || true
  return "$rc"
}
