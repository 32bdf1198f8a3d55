"""The ``caravan`` command."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from caravan import services
from core.settings import Settings, load_settings
from domain.idle.policy_file import PolicyFileError
from domain.scheduling_config import SchedulingConfigError
from gateway.graphql.limits import Limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="caravan", description="Compute sessions on Nomad.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("gateway", help="serve the GraphQL API")
    commands.add_parser("scheduler", help="place pending sessions and follow Nomad (one active at a time)")
    commands.add_parser("idle", help="reclaim idle sessions per the idle policy (one active at a time; SIGHUP reloads)")
    commands.add_parser("dev", help="gateway, scheduler and idle checker, each in its own supervised process")
    commands.add_parser(
        "namespace-keeper",
        help="keep this host's Nomad client's pool of network namespaces made ahead (caravan dev and caravan "
        "deploy run it)",
    )
    stack = commands.add_parser(
        "stack",
        help="start, stop or reset the one-machine stack (Redis, Nomad, Caravan); print the Nomad ACL "
        "policies and Redis users Caravan needs on a Nomad and Redis of your own",
    )
    stack.add_argument("action", choices=["up", "down", "reset", "status", "nomad-policies", "redis-users"])
    stack.add_argument("--yes", action="store_true", help="reset: delete every session and all state without asking")
    deploy = commands.add_parser(
        "deploy",
        help="render Caravan's Nomad jobs (gateway, ingress, scheduler, idle checker, namespace keepers) from a "
        "configuration file and submit them, their secrets in Nomad Variables",
    )
    deploy.add_argument("--config", type=Path, required=True, help="the deployment's JSON file (caravan/deploy.py)")
    deploy.add_argument("--render", action="store_true", help="print the job specs instead of submitting them")
    deploy.add_argument("--wait", type=float, default=0.0, help="seconds to wait for every deployment to succeed")
    deploy.add_argument(
        "--only",
        default="namespace-keeper,ingress,gateway,scheduler,idle",
        help="the jobs to submit, comma-separated (default: all)",
    )
    ingress = commands.add_parser("ingress", help="HAProxy with its gateway backend following a file of replicas")
    ingress.add_argument("--gateways", type=Path, required=True, help="a file of address:port lines")
    ingress.add_argument("--slots", type=int, default=16, help="the most gateway replicas the backend lists")
    ingress.add_argument("--health-port", type=int, help="where HAProxy answers GET /healthz (Nomad's check)")
    ingress.add_argument(
        "--keep-maps",
        action="store_true",
        help="keep HAProxy's app and endpoint maps here (the gateways run with CARAVAN_GATEWAY_KEEPS_MAPS=0)",
    )
    args = parser.parse_args(argv)

    try:
        settings = load_settings()
        if args.command in ("gateway", "dev"):
            Limits.from_env()  # the gateway reads them again; a bad CARAVAN_GRAPHQL_* value stops us here
    except ValueError as refused:  # a malformed CARAVAN_* value
        print(f"caravan: configuration refused: {refused}", file=sys.stderr)
        return 2
    services.configure_logging()
    if args.command in ("deploy", "ingress"):
        return deploy_command(args, settings)
    if args.command == "stack":
        from caravan.stack import dev_stack, nomad_acl, redis_acl

        if args.action == "nomad-policies":
            print(nomad_acl.describe_policies(settings.nomad.namespace, settings.nomad.platform_namespace))
            return 0
        if args.action == "redis-users":
            print(redis_acl.describe_users(settings.redis.prefix))
            return 0
        if args.action == "reset" and not args.yes:
            print(
                f"caravan: reset stops the stack, ends every session and deletes {settings.home} (sessions, users, "
                f"tokens, logs, secrets): run it again with --yes to do it",
                file=sys.stderr,
            )
            return 2
        return {"up": dev_stack.up, "down": dev_stack.down, "reset": dev_stack.reset, "status": dev_stack.status}[
            args.action
        ](settings)
    runner = {
        "scheduler": services.run_scheduler,
        "idle": services.run_idle,
        "namespace-keeper": services.run_namespace_keeper,
    }
    try:
        if args.command == "gateway":
            services.serve_gateway(settings)  # several worker processes: not inside an event loop
        elif args.command == "dev":
            return services.run_dev(settings)  # 2 when a child's configuration is refused
        else:
            asyncio.run(runner[args.command](settings))
    except KeyboardInterrupt:
        pass
    except (PolicyFileError, SchedulingConfigError) as refused:
        print(f"caravan: configuration refused: {refused}", file=sys.stderr)
        return 2
    return 0


def deploy_command(args: argparse.Namespace, settings: Settings) -> int:
    """``caravan deploy`` and ``caravan ingress`` (what the deployed ingress job runs)."""
    if args.command == "ingress":
        from caravan.ingress import run_ingress

        asyncio.run(run_ingress(settings, args.gateways, args.slots, args.health_port, keep_maps=args.keep_maps))
        return 0
    from caravan import deploy as deployment
    from caravan.stack.nomad_acl import NomadACLError

    try:
        config = deployment.load_config(args.config)
        if args.render:
            print(deployment.show(config, settings))
            return 0
        return deployment.deploy(config, settings, wait=args.wait, only=deployment.jobs_named(args.only))
    except (deployment.DeployError, NomadACLError) as refused:
        print(f"caravan deploy: {refused}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
