"""The plugin process: go-plugin's handshake, then Nomad's ``base`` and ``device`` services over gRPC.

go-plugin (what Nomad uses to run external plugins) starts the binary with ``NOMAD_PLUGIN_MAGIC_COOKIE`` set, reads
one line on stdout, ``1|2|unix|<socket>|grpc`` (core protocol 1, Nomad's plugin protocol 2, the address, gRPC), then
dials the socket: it checks gRPC health (service ``plugin``), asks for the plugin's info and config schema, sets the
config and, for a device plugin, opens the ``Fingerprint`` and ``Stats`` streams and calls ``Reserve`` before each
task that was granted devices. Nomad's loader starts no AutoMTLS, so the server is plain gRPC on a unix socket only
this user can open. Log lines go to stderr as hclog JSON, which go-plugin copies into Nomad's log at their level.

The stubs are generated from Nomad's own ``.proto`` files at set-up (``ops/install-device-protos``); the launcher puts
them on ``sys.path`` (package ``plugins``, as the protos name themselves).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import msgpack
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from node_plugins.devices.sim import inventory
from node_plugins.devices.sim.config import PLUGIN_NAME, PLUGIN_VERSION, SCHEMA, ConfigError, SimConfig, parse_config
from node_plugins.devices.sim.state import TASK_ALLOC_DIR, StateDir, task_load_name

MAGIC_COOKIE_KEY = "NOMAD_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255"
CORE_PROTOCOL = 1
APP_PROTOCOL = 2
PLUGIN_API_VERSION = "0.1.0"
"""Nomad's device plugin API version (``plugins/device.ApiVersion010``)."""
STATS_PERIOD_MAX = 0.25
"""Seconds between two statistics at most, whatever Nomad's collection interval (1 s): Nomad keeps the latest, so a
workload's new load waits for this plugin less than for Nomad's own collection."""

# The generated stubs: importable only with the launcher's sys.path, so imported when the server starts.
base_pb2: Any = None
base_grpc: Any = None
device_pb2: Any = None
device_grpc: Any = None
hclspec: Any = None
structs: Any = None
attribute_pb2: Any = None


def log(level: str, message: str, **fields: object) -> None:
    """One hclog JSON line on stderr: go-plugin logs it in Nomad's log at ``level``."""
    line = {"@level": level, "@message": message, "@timestamp": datetime.now(UTC).isoformat(), **fields}
    print(json.dumps(line, default=str), file=sys.stderr, flush=True)


def _load_stubs() -> None:
    global base_pb2, base_grpc, device_pb2, device_grpc, hclspec, structs, attribute_pb2
    from plugins.base.proto import base_pb2 as b  # type: ignore[import-not-found]
    from plugins.base.proto import base_pb2_grpc as bg
    from plugins.device.proto import device_pb2 as d  # type: ignore[import-not-found]
    from plugins.device.proto import device_pb2_grpc as dg
    from plugins.shared.hclspec import hcl_spec_pb2 as h  # type: ignore[import-not-found]
    from plugins.shared.structs.proto import attribute_pb2 as a  # type: ignore[import-not-found]
    from plugins.shared.structs.proto import stats_pb2 as s

    base_pb2, base_grpc, device_pb2, device_grpc, hclspec, structs, attribute_pb2 = b, bg, d, dg, h, s, a


def config_spec() -> Any:
    """:data:`node_plugins.devices.sim.config.SCHEMA` as Nomad's ``hclspec``: an object of attributes, defaults as
    literals."""
    attributes = {}
    for name, (kind, default) in SCHEMA.items():
        attr = hclspec.Spec(Attr=hclspec.Attr(name=name, type=kind, required=default is None))
        if default is not None:
            attr = hclspec.Spec(
                default=hclspec.Default(primary=attr, default=hclspec.Spec(literal=hclspec.Literal(value=default)))
            )
        attributes[name] = attr
    return hclspec.Spec(object=hclspec.Object(attributes=attributes))


class Plugin:
    """The plugin's state: its configuration once Nomad set it, and the state directory."""

    def __init__(self) -> None:
        self.config: SimConfig | None = None
        self.state: StateDir | None = None
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def configured(self, context: grpc.ServicerContext) -> tuple[SimConfig, StateDir]:
        if self.config is None or self.state is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{PLUGIN_NAME}: not configured yet")
        assert self.config is not None and self.state is not None
        return self.config, self.state


class BaseService:
    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin

    # the methods bear gRPC's names (CamelCase), as the generated servicers call them

    def PluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return base_pb2.PluginInfoResponse(
            type=base_pb2.DEVICE,
            plugin_api_versions=[PLUGIN_API_VERSION],
            plugin_version=PLUGIN_VERSION,
            name=PLUGIN_NAME,
        )

    def ConfigSchema(self, request: Any, context: grpc.ServicerContext) -> Any:
        return base_pb2.ConfigSchemaResponse(spec=config_spec())

    def SetConfig(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            raw = msgpack.unpackb(request.msgpack_config, raw=False) if request.msgpack_config else {}
            config = parse_config(raw if isinstance(raw, dict) else {})
            state = StateDir(config.state_dir, config.alloc_dir)
            state.create()
        except ConfigError as exc:
            log("error", str(exc))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except OSError as exc:
            message = f"{PLUGIN_NAME} config: state_dir cannot be used: {exc}"
            log("error", message)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        self.plugin.config, self.plugin.state = config, state
        log("info", "configured", devices=config.count, model=config.model, shares=config.shares)
        if config.alloc_dir is None:
            log("warn", "alloc_dir is not set: the load files docker and exec tasks write are not read")
        return base_pb2.SetConfigResponse()


class DeviceService:
    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin

    def Fingerprint(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        config, state = self.plugin.configured(context)
        last: tuple[inventory.Group, ...] | None = None
        while context.is_active() and not self.plugin.stopping.is_set():
            found = inventory.groups(config, state.unhealthy(inventory.device_ids(config)))
            if found != last:
                if last is not None:
                    log(
                        "info", "device health changed", unhealthy=sorted(state.unhealthy(inventory.device_ids(config)))
                    )
                last = found
                yield device_pb2.FingerprintResponse(device_group=[_group(g) for g in found])
            self.plugin.stopping.wait(config.fingerprint_period)

    def Reserve(self, request: Any, context: grpc.ServicerContext) -> Any:
        config, state = self.plugin.configured(context)
        ids = list(request.device_ids)
        if not ids or (unknown := inventory.unknown_ids(config, ids)):
            message = (
                f"{PLUGIN_NAME}: no such device: {', '.join(unknown)}" if ids else f"{PLUGIN_NAME}: no device asked"
            )
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{PLUGIN_NAME}: {message}")
        with self.plugin.lock:
            reservation = state.reserve(ids)
        env = inventory.reservation_env(config, ids, f"{TASK_ALLOC_DIR}/{task_load_name(reservation.name)}")
        env["CARAVAN_SIM_HOST_LOAD_FILE"] = str(reservation / "load")  # for raw_exec, which has no /alloc of its own
        log("info", "reserved", ids=ids, reservation=reservation.name)
        # Environment only, no mounts (as NVIDIA's plugin): Nomad keeps the mounts of the last task hook that
        # returned any, so a reservation's mounts would replace the task's volume mounts (its storage folders).
        return device_pb2.ReserveResponse(container_res=device_pb2.ContainerReservation(envs=env))

    def Stats(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        config, state = self.plugin.configured(context)
        interval = request.collection_interval.ToTimedelta().total_seconds() or 1.0
        found = inventory.groups(config, {})
        ids = [i.id for g in found for i in g.instances]
        while context.is_active() and not self.plugin.stopping.is_set():
            loads = state.loads(ids)
            now = time.time()
            yield device_pb2.StatsResponse(groups=[_group_stats(config, g, loads, now) for g in found])
            self.plugin.stopping.wait(min(max(interval, 0.05), STATS_PERIOD_MAX))


def _group(group: inventory.Group) -> Any:
    return device_pb2.DeviceGroup(
        vendor=group.vendor,
        device_type=group.type,
        device_name=group.name,
        devices=[
            device_pb2.DetectedDevice(ID=i.id, healthy=i.healthy, health_description=i.health_description)
            for i in group.instances
        ],
        attributes={name: _attribute(name, value) for name, value in group.attributes.items()},
    )


def _attribute(name: str, value: str | int | bool) -> Any:
    if isinstance(value, bool):
        return attribute_pb2.Attribute(bool_val=value)
    if isinstance(value, int):
        return attribute_pb2.Attribute(int_val=value, unit="MiB" if name == "memory" else "")
    return attribute_pb2.Attribute(string_val=value)


def _group_stats(
    config: SimConfig, group: inventory.Group, loads: dict[str, tuple[inventory.Load | None, int]], now: float
) -> Any:
    stats = {}
    for instance in group.instances:
        load, holders = loads.get(instance.id, (None, 0))
        reading = inventory.instance_stats(config, instance.id, load, holders)
        memory = structs.StatValue(unit="MiB", desc="Device memory in use / total")
        memory.int_numerator_val.value = reading.mem_used_mib
        memory.int_denominator_val.value = reading.mem_total_mib
        util = structs.StatValue(unit="%", desc="Busy time, as the workload reports it")
        util.float_numerator_val.value = reading.util
        entry = device_pb2.DeviceStats(
            summary=memory, stats=structs.StatObject(attributes={"GPU utilization": util, "Memory state": memory})
        )
        entry.timestamp.FromNanoseconds(int(now * 1e9))
        stats[instance.id] = entry
    return device_pb2.DeviceGroupStats(vendor=group.vendor, type=group.type, name=group.name, instance_stats=stats)


def _controller(plugin: Plugin, server_ref: list[grpc.Server]) -> grpc.GenericRpcHandler:
    """go-plugin's ``plugin.GRPCController`` (``Shutdown``, empty messages): Nomad asks the plugin to exit."""

    def shutdown(request: bytes, context: grpc.ServicerContext) -> bytes:
        plugin.stopping.set()
        threading.Thread(target=lambda: server_ref[0].stop(grace=0.5), daemon=True).start()
        return b""

    handler = grpc.unary_unary_rpc_method_handler(shutdown, request_deserializer=bytes, response_serializer=bytes)
    return grpc.method_handlers_generic_handler("plugin.GRPCController", {"Shutdown": handler})


ORPHAN_CHECK = 1.0
"""Seconds between looks at whether the Nomad agent that started the plugin is still its parent."""


def _stop_when_orphaned(server: grpc.Server, parent: int) -> None:
    """Stop serving once the agent that started us is gone. Nomad stops its plugins when it shuts down, but an agent
    killed outright (SIGKILL, OOM) cannot: its plugin would be re-parented and serve nobody for ever."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK)
    server.stop(grace=None)


def serve() -> int:
    """Run as Nomad's plugin; without go-plugin's cookie, explain and exit."""
    parent = os.getppid()  # before the handshake: once Nomad has read it, it may be gone
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        print(
            f"{PLUGIN_NAME} is a Nomad device plugin: put it in a Nomad client's plugin_dir and configure it with a "
            f'plugin "{PLUGIN_NAME}" {{ config {{ ... }} }} block; it is not meant to be run by hand.',
            file=sys.stderr,
        )
        return 1
    _load_stubs()
    plugin = Plugin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    base_grpc.add_BasePluginServicer_to_server(BaseService(plugin), server)
    device_grpc.add_DevicePluginServicer_to_server(DeviceService(plugin), server)
    checker = health.HealthServicer()
    checker.set("plugin", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    server.add_generic_rpc_handlers((_controller(plugin, [server]),))
    directory = Path(tempfile.mkdtemp(prefix="caravan-sim-", dir=os.environ.get("PLUGIN_UNIX_SOCKET_DIR")))
    socket = directory / "plugin.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    print(f"{CORE_PROTOCOL}|{APP_PROTOCOL}|unix|{socket}|grpc", flush=True)
    threading.Thread(target=_stop_when_orphaned, args=(server, parent), daemon=True).start()
    try:
        server.wait_for_termination()
    finally:
        plugin.stopping.set()
        socket.unlink(missing_ok=True)
        directory.rmdir()
    return 0
