"""Usage as CSV over HTTP: ``GET /usage.csv?from=YYYY-MM-DD&to=YYYY-MM-DD&groupBy=project,day&timeZone=UTC`` with an
API token (``Authorization: Bearer``), the same report as GraphQL's ``usage`` (``stores.usage.report_for``: a user
their own usage, an ADMIN also their projects', a SUPERADMIN everyone's). Errors are JSON, as ``gateway.files``'."""

from __future__ import annotations

import csv
import io
from datetime import date
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from core.clock import utcnow
from core.errors import CaravanError, InvalidInput, Unauthenticated
from domain.usage import GroupBy, check_period, parse_group_by, report_table
from gateway.auth import authenticate, header_token
from gateway.files import error_response
from stores.usage import report_for

PATH = "/usage.csv"


def routes(state: dict[str, Any]) -> list[Route]:
    async def export(request: Request) -> Response:
        try:
            return await usage_csv(state, request)
        except CaravanError as exc:
            return error_response(exc)

    return [Route(PATH, export, methods=["GET"])]


def day_of(request: Request, name: str) -> date:
    raw = request.query_params.get(name, "")
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a date such as 2026-11-01, not {raw[:40]!r}", field=name) from None


def inert(cell: str) -> str:
    """A cell a spreadsheet will not run as a formula (a project named ``=cmd()``: quoted with a leading ')."""
    return "'" + cell if cell[:1] in FORMULA_STARTS else cell


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


async def usage_csv(state: dict[str, Any], request: Request) -> Response:
    found = await authenticate(state["users"], header_token(request.headers))
    if found is None:
        raise Unauthenticated("send a valid API token as 'Authorization: Bearer <token>'")
    period = check_period(day_of(request, "from"), day_of(request, "to"), request.query_params.get("timeZone"))
    raw_group_by = request.query_params.get("groupBy", GroupBy.DAY)
    group_by = parse_group_by(part for part in raw_group_by.split(",") if part.strip())
    rows = await report_for(state["sessions"].usage, found.user, period, group_by, now=utcnow())
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(
        [[inert(cell) for cell in line] for line in report_table(rows, group_by)]
    )
    filename = f"usage-{period.first.isoformat()}-{period.last.isoformat()}.csv"
    return Response(
        text.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
