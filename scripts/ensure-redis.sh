#!/usr/bin/env bash
# Make sure a Redis answers at $REDIS_URL (default redis://127.0.0.1:6379/0): use the one
# already running, else start Debian's redis-server (installing it if missing).
set -euo pipefail
url="${REDIS_URL:-redis://127.0.0.1:6379/0}"
hostport="${url#redis://}"; hostport="${hostport#*@}"; hostport="${hostport%%/*}"
host="${hostport%%:*}"; port="${hostport##*:}"; [ "$port" = "$host" ] && port=6379

answers() { (exec 3<>"/dev/tcp/$host/$port" && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG) 2>/dev/null; }

if answers; then exit 0; fi
if ! command -v redis-server >/dev/null; then
  echo "redis-server not found: installing Debian's redis-server" >&2
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; fi
fi
mkdir -p var/redis
echo "starting redis-server on $host:$port" >&2
redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
  --dir "$PWD/var/redis" --logfile "$PWD/var/redis/redis.log"
for _ in $(seq 1 50); do answers && exit 0; sleep 0.1; done
echo "redis-server did not come up on $host:$port (see var/redis/redis.log)" >&2
exit 1
