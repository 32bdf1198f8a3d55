# Shared by every ops/ script: where things live. Source it; it changes nothing by itself.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARAVAN_HOME=${CARAVAN_HOME:-$ROOT/.caravan}
export CARAVAN_CACHE=${CARAVAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/caravan}
VENV=$ROOT/.venv
STACK_ENV=$CARAVAN_CACHE/stack.env
mkdir -p "$CARAVAN_HOME/logs" "$CARAVAN_CACHE"

say() { printf 'caravan: %s\n' "$*" >&2; }

# Debian packages, installed only when missing; apt's index is refreshed at most once per run.
apt_ensure() {
  local missing=()
  for pkg in "$@"; do dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

load_stack_env() { [ -f "$STACK_ENV" ] && set -a && . "$STACK_ENV" && set +a; return 0; }
