"""Several server processes acting as one site: who is alive, how busy, who watches what.

Processes cooperate only through what the site already runs. With ``REDIS_URL`` set, each
process advertises itself in Redis with a short expiry and reads the others' entries:

- ``{prefix}:procs`` — a set of process ids (dead ones are pruned on read);
- ``{prefix}:seen`` — a hash ``pid -> unix time`` of the latest advertisement: a process
  is *dead* when it is known here but its entry expired. Only dead processes' answers are
  failed over, so sites that share a database under different prefixes leave each other
  alone;
- ``{prefix}:proc:{pid}`` — JSON ``{channel, ready, running, waiting, free_kv, live}``,
  expiring ``PROCESS_TTL_SECONDS`` after the latest refresh: a process that died is gone
  from routing within that time, and its answers are failed over (see
  ``conversations.cluster.process_loop.fail_over``);
- ``{prefix}:watch:{conversation_id}`` — a hash ``pid -> unix expiry``: the processes with
  a tab showing that conversation, so the owner of a live answer runs its grace period
  only when no tab anywhere shows it;
- ``{prefix}:claim:{message_id}`` — the process that claimed a forwarded answer (the
  owner's acknowledgement, or the tab's process taking it back; see
  ``conversations.cluster.handoff``), expiring after a while.

Each process also listens on a channel of its own (``channel`` in its entry), on a channel
layer instance of its own (:func:`process_layer`): the tab's process sends it
``chat.generate`` (claim this answer and run it here),
``chat.stop``, ``chat.snapshot`` (send this tab the text so far) and ``chat.retain`` /
``chat.release`` (KV retention of a conversation whose answers this process generated).

Without ``REDIS_URL`` the site is this process alone, and every function here says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from dataclasses import asdict, dataclass

from channels.layers import channel_layers, get_channel_layer
from django.conf import settings

log = logging.getLogger(__name__)

# Identifies this process in the registry, in Message.owner_process and on group events.
PROCESS_ID = uuid.uuid4().hex
ADVERTISE_SECONDS = 2.0
PROCESS_TTL_SECONDS = 10
WATCH_TTL_SECONDS = 10


def enabled() -> bool:
    """Several processes may serve the site (the Redis channel layer is in use)."""
    return bool(settings.REDIS_URL)


def _key(*parts: object) -> str:
    return ":".join([settings.CLUSTER_PREFIX, *map(str, parts)])


@dataclass
class ProcessInfo:
    pid: str
    channel: str = ""
    ready: bool = False  # the engine is loaded
    running: int = 0
    waiting: int = 0
    free_kv: int = 0  # free (or only cached) KV blocks
    live: int = 0  # chat answers this process owns

    @property
    def load(self) -> int:
        return max(self.running + self.waiting, self.live)


_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def redis_client():
    """An asyncio Redis client bound to the running loop (clients cannot cross loops)."""
    import redis.asyncio as aioredis

    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = aioredis.from_url(settings.REDIS_URL, socket_timeout=5)
    return client


PROCESS_LAYER = "cluster"


def process_layer():
    """The channel layer of the processes' own channels: an instance apart from the
    consumers' (the ``cluster`` alias of ``CHANNEL_LAYERS``), so a tab's disconnect cannot
    touch it; the default layer where there is no such alias (one process, in memory)."""
    return get_channel_layer(PROCESS_LAYER if PROCESS_LAYER in channel_layers else "default")


# --- Advertising and reading the registry -------------------------------------------


async def advertise(info: ProcessInfo) -> bool:
    """Refresh this process's entry; False if it had expired (or never existed): other
    processes may have taken this one for dead and failed over its answers meanwhile."""
    client = redis_client()
    async with client.pipeline(transaction=False) as pipe:
        pipe.sadd(_key("procs"), info.pid)
        pipe.hset(_key("seen"), info.pid, time.time())
        pipe.set(_key("proc", info.pid), json.dumps(asdict(info)), ex=PROCESS_TTL_SECONDS, get=True)
        *_, previous = await pipe.execute()
    return previous is not None


async def withdraw(pid: str) -> None:
    client = redis_client()
    await client.delete(_key("proc", pid))
    await client.srem(_key("procs"), pid)


async def live_processes() -> dict[str, ProcessInfo]:
    """The processes whose entry has not expired, by id. Alone: only this one."""
    if not enabled():
        return {PROCESS_ID: ProcessInfo(PROCESS_ID, ready=True)}
    client = redis_client()
    pids = sorted(p.decode() for p in await client.smembers(_key("procs")))
    if not pids:
        return {}
    values = await client.mget([_key("proc", pid) for pid in pids])
    alive: dict[str, ProcessInfo] = {}
    dead = []
    for pid, raw in zip(pids, values, strict=True):
        if raw is None:
            dead.append(pid)
            continue
        try:
            alive[pid] = ProcessInfo(**json.loads(raw))
        except (TypeError, ValueError):
            log.warning("unreadable registry entry for %s", pid)
    if dead:
        await client.srem(_key("procs"), *dead)
    return alive


async def live_process_ids() -> set[str]:
    return set(await live_processes()) | {PROCESS_ID}


async def known_process_ids() -> set[str]:
    """Every process that ever advertised under this prefix (alive or dead)."""
    if not enabled():
        return {PROCESS_ID}
    return {pid.decode() for pid in await redis_client().hkeys(_key("seen"))}


@dataclass
class Liveness:
    """Which owners of live answers are alive. Without a registry (one process), every
    owner but this process is a previous run of it, hence dead."""

    live: set[str]
    known: set[str] | None = None  # None: every process not live is dead

    def is_dead(self, pid: str) -> bool:
        return bool(pid) and pid not in self.live and (self.known is None or pid in self.known)


async def liveness() -> Liveness:
    if not enabled():
        return Liveness({PROCESS_ID})
    return Liveness(await live_process_ids(), await known_process_ids())


# --- Watchers -------------------------------------------------------------------------


async def set_watching(conversation_ids: list[int]) -> None:
    """This process has tabs showing these conversations (refreshed periodically)."""
    if not enabled() or not conversation_ids:
        return
    expiry = time.time() + WATCH_TTL_SECONDS
    async with redis_client().pipeline(transaction=False) as pipe:
        for cid in conversation_ids:
            pipe.hset(_key("watch", cid), PROCESS_ID, expiry)
            pipe.expire(_key("watch", cid), WATCH_TTL_SECONDS)
        await pipe.execute()


async def clear_watching(conversation_id: int) -> None:
    if enabled():
        await redis_client().hdel(_key("watch", conversation_id), PROCESS_ID)


async def watched_elsewhere(conversation_id: int) -> bool:
    """Whether a tab in another process shows the conversation."""
    if not enabled():
        return False
    entries = await redis_client().hgetall(_key("watch", conversation_id))
    now = time.time()
    return any(pid.decode() != PROCESS_ID and float(exp) > now for pid, exp in entries.items())


# --- Routing --------------------------------------------------------------------------


def choose_owner(preferred: str | None, processes: dict[str, ProcessInfo]) -> str:
    """The process that should generate the next answer of a conversation.

    The one that served it last (its KV blocks are warm there) unless it is gone or busier
    than the least-loaded process by more than ``AFFINITY_MAX_EXTRA_LOAD`` requests; then the
    least-loaded live process, this one on a tie (no hop)."""
    ready = {pid: info for pid, info in processes.items() if info.ready and info.channel}
    if PROCESS_ID in processes:
        ready[PROCESS_ID] = processes[PROCESS_ID]
    if not ready:
        return PROCESS_ID
    least = min(ready.values(), key=lambda p: (p.load, p.pid != PROCESS_ID))
    if preferred in ready and ready[preferred].load <= least.load + settings.AFFINITY_MAX_EXTRA_LOAD:
        return preferred
    return least.pid


async def send_to_process(info: ProcessInfo, message: dict) -> bool:
    """A control message to another process's channel; False if it could not be sent."""
    layer = process_layer()
    if layer is None or not info.channel:
        return False
    try:
        await layer.send(info.channel, message)
    except Exception:
        log.warning("sending %s to process %s failed", message.get("type"), info.pid, exc_info=True)
        return False
    return True
