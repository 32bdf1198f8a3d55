"""Every Redis key Caravan uses, in one place (as arq's ``constants.py``).

All keys live under one prefix so that tests (and several Caravans on one Redis) stay apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def session(self, session_id: str) -> str:
        """JSON document of one session."""
        return f"{self.prefix}:session:{session_id}"

    @property
    def sessions_by_created(self) -> str:
        """ZSET of every session id scored by creation time (listing, paging)."""
        return f"{self.prefix}:sessions:by-created"

    def sessions_of_owner(self, owner_id: str) -> str:
        """ZSET of one owner's session ids scored by creation time."""
        return f"{self.prefix}:sessions:owner:{owner_id}"

    def sessions_of_project(self, project: str) -> str:
        """ZSET of one project's session ids scored by creation time (admins' listing scope)."""
        return f"{self.prefix}:sessions:project:{project}"

    def sessions_with_status(self, status: str) -> str:
        """SET of the session ids now in one status (listing filter; moved in the same MULTI as the document)."""
        return f"{self.prefix}:sessions:status:{status}"

    def sessions_of_type(self, session_type: str) -> str:
        """SET of the session ids of one session type (listing filter)."""
        return f"{self.prefix}:sessions:type:{session_type}"

    def sessions_in_group(self, resource_group: str) -> str:
        """SET of the session ids of one resource group, whatever their status (listing filter)."""
        return f"{self.prefix}:sessions:group:{resource_group}"

    @property
    def sessions_by_terminated(self) -> str:
        """ZSET of ended (TERMINATED/CANCELLED) session ids scored by when they ended (listing order and filter)."""
        return f"{self.prefix}:sessions:by-terminated"

    @property
    def session_names(self) -> str:
        """HASH session id -> name, so that a name filter scans names without reading whole documents."""
        return f"{self.prefix}:sessions:names"

    @property
    def listing_indexes_version(self) -> str:
        """Which version of the listing indexes every stored session is in (``SessionStore.ensure_listing_indexes``)."""
        return f"{self.prefix}:sessions:listing-indexes-version"

    @property
    def sessions_version(self) -> str:
        """Counter incremented in the MULTI of every write of a session document or listing index; the gateway's
        result cache (``gateway.graphql.result_cache``) serves a stored answer only while it is unchanged."""
        return f"{self.prefix}:sessions:version"

    def listing_scratch(self, request_id: str) -> str:
        """Short-lived ZSET combining indexes for one filtered listing request (deleted after it; expires anyway)."""
        return f"{self.prefix}:sessions:scratch:{request_id}"

    @property
    def sessions_live(self) -> str:
        """SET of session ids not yet in a terminal status (reconciliation walks it)."""
        return f"{self.prefix}:sessions:live"

    @property
    def session_revisions(self) -> str:
        """HASH of live session id -> a token that changes with every write of its document (``stores.sessions``):
        a reader keeping decoded documents (the idle checker's ``idle.views``) reads again only those whose token
        changed. Dropped when the session ends."""
        return f"{self.prefix}:sessions:revisions"

    @property
    def session_changes(self) -> str:
        """STREAM of session document writes, one entry per transaction naming the sessions it wrote (appended in
        its MULTI, ``stores.session_changes``): the idle checker reads only what changed since its cursor. Capped."""
        return f"{self.prefix}:sessions:changes"

    def pending_queue(self, resource_group: str) -> str:
        """ZSET of PENDING session ids of a resource group scored by creation time."""
        return f"{self.prefix}:queue:{resource_group}"

    @property
    def resource_groups(self) -> str:
        """SET of resource groups that have (or had) pending sessions."""
        return f"{self.prefix}:resource-groups"

    @property
    def work_to_submit(self) -> str:
        """SET of SCHEDULED session ids whose Nomad job may not be registered yet."""
        return f"{self.prefix}:sessions:to-submit"

    @property
    def jobs_to_stop(self) -> str:
        """HASH session id -> ``stop`` or ``purge``: sessions whose Nomad job the job owner must stop (written in the
        MULTI that moves a session with a job to TERMINATING or TERMINATED, or that forces its end)."""
        return f"{self.prefix}:jobs:to-stop"

    @property
    def jobs_to_restart(self) -> str:
        """HASH session id -> when a restart was asked (unix seconds): sessions whose kernels the job owner restarts."""
        return f"{self.prefix}:jobs:to-restart"

    @property
    def job_owner_wakeup(self) -> str:
        """LIST pushed to (in the same MULTI) whenever the job owner has new work: a job to register, stop or
        restart."""
        return f"{self.prefix}:jobs:wakeup"

    @property
    def batch_deadlines(self) -> str:
        """ZSET of RUNNING BATCH session ids scored by when their batch timeout expires."""
        return f"{self.prefix}:sessions:batch-deadlines"

    def live_name(self, owner_id: str, name: str) -> str:
        """Claim on a session name, unique per owner among live sessions."""
        return f"{self.prefix}:name:{owner_id}:{name}"

    def client_token(self, owner_id: str, token: str) -> str:
        """Idempotency record: a creation request's client token → the session id(s) it made."""
        return f"{self.prefix}:client-token:{owner_id}:{token}"

    @property
    def user_prefix(self) -> str:
        """Start of every user document's key (the token check script appends the user id it finds)."""
        return f"{self.prefix}:user:"

    def user(self, user_id: str) -> str:
        """JSON document of one user."""
        return f"{self.user_prefix}{user_id}"

    @property
    def all_users(self) -> str:
        """SET of every user id."""
        return f"{self.prefix}:users"

    def project_members(self, project: str) -> str:
        """SET of the ids of one project's users."""
        return f"{self.prefix}:project-members:{project}"

    def api_token(self, token_hash: str) -> str:
        """HASH record of one API token, by the SHA-256 of its secret: id, user, label, created, expires, last_used."""
        return f"{self.prefix}:api-token:{token_hash}"

    @property
    def no_token(self) -> str:
        """A token record key that never exists (no SHA-256 is "none"): what the token check reads for a request
        without a token. Not "": Redis' ACL refuses a key outside the component's ``<prefix>:*``."""
        return self.api_token("none")

    @property
    def api_token_ids(self) -> str:
        """HASH API token id -> SHA-256 of its secret (revoking by id)."""
        return f"{self.prefix}:api-token-ids"

    def user_tokens(self, user_id: str) -> str:
        """SET of the ids of one user's API tokens."""
        return f"{self.prefix}:user-tokens:{user_id}"

    @property
    def users_version(self) -> str:
        """Counter incremented in the MULTI of every write of a user, a token or a revocation: the app data plane's
        control (``gateway.apps.control``) reads users and tokens again when it changed."""
        return f"{self.prefix}:users:version"

    @property
    def route_changes(self) -> str:
        """STREAM with an entry in the MULTI of every write that bumps ``sessions_version``, ``users_version`` or
        ``endpoints_version`` (capped in length): the data plane's control planes (``gateway.apps.plane``) block
        reading it (``XREAD BLOCK``) instead of polling the counters."""
        return f"{self.prefix}:route-changes"

    @property
    def token_revocations(self) -> str:
        """STREAM of revoked tokens (``token``: the SHA-256 of the secret), appended in the MULTI of each revocation
        and capped in length; every gateway process reads it to close the revoked tokens' WebSocket connections."""
        return f"{self.prefix}:token-revocations"

    @property
    def scheduler_wakeup(self) -> str:
        """LIST the gateway pushes to when there is new work; the scheduler blocks on it."""
        return f"{self.prefix}:scheduler:wakeup"

    @property
    def scheduler_lease(self) -> str:
        return f"{self.prefix}:lease:scheduler"

    @property
    def scheduler_fence(self) -> str:
        """Monotonic fencing counter: each new leadership term takes the next number."""
        return f"{self.prefix}:lease:scheduler:fence"

    @property
    def nomad_event_index(self) -> str:
        """Last Nomad event-stream index applied, to resume after a disconnect."""
        return f"{self.prefix}:nomad:event-index"

    @property
    def scheduler_roundrobin(self) -> str:
        """HASH resource group -> next agent index of the round-robin selector (survives a new leader)."""
        return f"{self.prefix}:scheduler:roundrobin"

    @property
    def known_slot_types(self) -> str:
        """HASH slot name -> slot type (``count``/``bytes``) of every slot any agent ever reported; never shrinks.

        Written by the scheduler, read by the gateway to refuse requests for slots no agent has."""
        return f"{self.prefix}:scheduler:slot-types"

    @property
    def known_resource_groups(self) -> str:
        """SET of the resource groups sessions may be created in: the node pools the scheduler has seen a client in
        and the groups of its configuration; never shrinks. Written by the scheduler, read by the gateway."""
        return f"{self.prefix}:scheduler:resource-groups"

    def user_policy(self, user_id: str) -> str:
        """JSON resource policy of one user (concurrency, pending and slot limits)."""
        return f"{self.prefix}:policy:user:{user_id}"

    def project_policy(self, project: str) -> str:
        """JSON resource policy of one project (slot limits)."""
        return f"{self.prefix}:policy:project:{project}"

    @property
    def users_with_policy(self) -> str:
        """SET of the user ids that have a stored resource policy (``resourcePolicies`` lists them)."""
        return f"{self.prefix}:policies:users"

    @property
    def projects_with_policy(self) -> str:
        """SET of the projects that have a stored resource policy."""
        return f"{self.prefix}:policies:projects"

    @property
    def resource_presets(self) -> str:
        """HASH preset name -> JSON resource preset."""
        return f"{self.prefix}:presets"

    def folder(self, folder_id: str) -> str:
        """JSON document of one storage folder (``domain.storage.Folder``)."""
        return f"{self.prefix}:folder:{folder_id}"

    @property
    def folders(self) -> str:
        """SET of every folder id (superadmins' listing, the job owner's purge sweep)."""
        return f"{self.prefix}:folders"

    def folders_of_owner(self, owner_id: str) -> str:
        """SET of the ids of one user's folders (their count quota)."""
        return f"{self.prefix}:folders:owner:{owner_id}"

    def folders_of_project(self, project: str) -> str:
        """SET of the ids of one project's folders (its count quota, its admins' listing)."""
        return f"{self.prefix}:folders:project:{project}"

    def folders_shared_with_user(self, user_id: str) -> str:
        """SET of the ids of the folders shared with one user."""
        return f"{self.prefix}:folders:shared-user:{user_id}"

    def folders_shared_with_project(self, project: str) -> str:
        """SET of the ids of the folders shared with one project's members."""
        return f"{self.prefix}:folders:shared-project:{project}"

    def folder_name(self, owner_id: str, name: str) -> str:
        """Claim on a folder name, unique per owner (trashed folders keep theirs until purged)."""
        return f"{self.prefix}:folder-name:{owner_id}:{name}"

    def folder_usage(self, folder_id: str) -> str:
        """Bytes a folder holds, as the file API counted them (its bytes quota)."""
        return f"{self.prefix}:folder-usage:{folder_id}"

    @property
    def folders_to_create(self) -> str:
        """SET of folder ids whose volume the job owner must create (written with the CREATING document)."""
        return f"{self.prefix}:folders:to-create"

    @property
    def folders_to_purge(self) -> str:
        """ZSET of trashed folder ids scored by when the job owner deletes their volume (unix seconds)."""
        return f"{self.prefix}:folders:to-purge"

    def image(self, image_id: str) -> str:
        """JSON document of one committed image (``domain.images.CommittedImage``)."""
        return f"{self.prefix}:image:{image_id}"

    @property
    def environments(self) -> str:
        """HASH image reference -> JSON of its environment catalog entry (``domain.environments``)."""
        return f"{self.prefix}:environments"

    def image_by_ref(self, ref: str) -> str:
        """The id of the committed image whose reference is ``ref`` (claimed at commit: one image per reference)."""
        return f"{self.prefix}:image-ref:{ref}"

    def images_of_owner(self, owner_id: str) -> str:
        """SET of the ids of one user's committed images."""
        return f"{self.prefix}:images:owner:{owner_id}"

    def images_of_project(self, project: str) -> str:
        """SET of the ids of one project's committed images (its admins' listing)."""
        return f"{self.prefix}:images:project:{project}"

    @property
    def images_to_act_on(self) -> str:
        """SET of image ids the job owner must commit (COMMITTING) or remove (DELETING) on their node."""
        return f"{self.prefix}:images:to-act-on"

    def template(self, template_id: str) -> str:
        """JSON document of one session template."""
        return f"{self.prefix}:template:{template_id}"

    @property
    def templates(self) -> str:
        """SET of every template id (superadmins' listing)."""
        return f"{self.prefix}:templates"

    def templates_of_owner(self, owner_id: str) -> str:
        """SET of the ids of the templates one user created (personal and project ones)."""
        return f"{self.prefix}:templates:owner:{owner_id}"

    def templates_of_project(self, project: str) -> str:
        """SET of the ids of one project's templates: its project templates and its members' personal ones."""
        return f"{self.prefix}:templates:project:{project}"

    def schedule(self, schedule_id: str) -> str:
        """JSON document of one recurring schedule (``domain.schedules``), with its runner state."""
        return f"{self.prefix}:schedule:{schedule_id}"

    @property
    def schedules(self) -> str:
        """ZSET of every schedule id scored by creation time (admins' listing)."""
        return f"{self.prefix}:schedules"

    def schedules_of_owner(self, owner_id: str) -> str:
        """ZSET of one user's schedule ids scored by creation time."""
        return f"{self.prefix}:schedules:owner:{owner_id}"

    @property
    def schedules_due(self) -> str:
        """ZSET of active schedule ids scored by when the runner must look at them next (unix seconds): the next
        due time, or a trigger. Paused and finished schedules are not in it."""
        return f"{self.prefix}:schedules:due"

    def schedule_runs(self, schedule_id: str) -> str:
        """LIST of one schedule's run records (JSON), newest first, capped at the history length."""
        return f"{self.prefix}:schedule:{schedule_id}:runs"

    @property
    def schedules_wakeup(self) -> str:
        """LIST the gateway pushes to when a schedule is created, changed or triggered; the runner blocks on it."""
        return f"{self.prefix}:schedules:wakeup"

    @property
    def idle_lease(self) -> str:
        return f"{self.prefix}:lease:idle"

    @property
    def idle_fence(self) -> str:
        """Fencing counter of the idle checker's leadership terms."""
        return f"{self.prefix}:lease:idle:fence"

    @property
    def idle_last_activity(self) -> str:
        """ZSET of session ids scored by their last user traffic (unix seconds), written by the gateway."""
        return f"{self.prefix}:idle:last-activity"

    @property
    def idle_open_connections(self) -> str:
        """ZSET of every open app connection (member: the JSON ``[session id, connection id]``), scored by when each
        lapses unless refreshed (``stores.activity``)."""
        return f"{self.prefix}:idle:open-connections"

    def file_link(self, link_hash: str) -> str:
        """STRING of one download link of a folder's file (by the SHA-256 of the link's secret; single use, short TTL):
        the JSON ``stores.file_links.FileLink``."""
        return f"{self.prefix}:file-link:{link_hash}"

    def app_launch(self, code_hash: str) -> str:
        """HASH of one app launch code (by the SHA-256 of the code; single use, short TTL): the token hash, session
        and app it opens (``stores.app_access``)."""
        return f"{self.prefix}:app-launch:{code_hash}"

    def idle_report(self, session_id: str) -> str:
        """JSON of the idle checker's last verdict on a session (short TTL; GraphQL ``idleChecks``)."""
        return f"{self.prefix}:idle:report:{session_id}"

    def idle_series(self, session_id: str) -> str:
        """LIST of a session's utilization over its life, oldest first, one ``domain.idle.series.SeriesPoint`` JSON per
        element (per kernel, with the thresholds judged); the idle leader appends a point per sweep and rewrites it
        compacted now and then; it expires ``SERIES_RETENTION`` after the last point (the session page's charts)."""
        return f"{self.prefix}:idle:series:{session_id}"

    @property
    def idle_window_tables(self) -> str:
        """HASH table name -> one table of the utilization windows (``domain.idle.columns.WindowTableDoc`` JSON: one
        metric of every window of one shape), saved now and then so a new leader resumes."""
        return f"{self.prefix}:idle:window-tables"

    @property
    def idle_windows(self) -> str:
        """HASH session id -> utilization window JSON (``domain.idle.window.WindowDoc``): how the windows were saved
        before :attr:`idle_window_tables`; read once when that is absent, deleted at the next save."""
        return f"{self.prefix}:idle:windows"

    @property
    def idle_policy(self) -> str:
        """HASH of the policy the idle checker enforces: ``source`` (file path or "built-in") and ``text``."""
        return f"{self.prefix}:idle:policy"

    def session_events(self, session_id: str) -> str:
        """STREAM of one session's status changes (``stores.events``); expires a while after the session ends."""
        return f"{self.prefix}:events:session:{session_id}"

    def owner_events(self, owner_id: str) -> str:
        """STREAM of status changes of all of one owner's sessions (``stores.events``), capped in length."""
        return f"{self.prefix}:events:owner:{owner_id}"

    @property
    def rate_limit_prefix(self) -> str:
        """Start of every rate-limit counter's key (the admission script appends the subject and the window)."""
        return f"{self.prefix}:rate:"

    def rate_limit(self, subject: str, window: int) -> str:
        """Counter of one user's (or, without a valid token, one client address's) GraphQL requests in one fixed
        window (``user:<id>``, ``addr:<address>``); expires with it."""
        return f"{self.rate_limit_prefix}{subject}:{window}"

    # -- usage accounting (stores.usage) ----------------------------------------------------------------

    @property
    def endpoint_loads(self) -> str:
        """HASH INFERENCE session id -> its endpoint's latest load sample (JSON ``endpoint_traffic.EndpointLoad``),
        written by the ingress's control plane from HAProxy's counters, read by the autoscaler."""
        return f"{self.prefix}:endpoints:loads"

    @property
    def endpoint_wakes(self) -> str:
        """LIST of INFERENCE session ids whose endpoint got a request while it had no ready replica (the activator
        pushes, the autoscaler pops at once: a cold start is asked for now, not at the next tick)."""
        return f"{self.prefix}:endpoints:wakes"

    @property
    def endpoints_version(self) -> str:
        """Counter bumped by every write of an endpoint's access (public flag, token issued or revoked): the endpoint
        control plane (``gateway.endpoints.control``) reads what changed when it moves."""
        return f"{self.prefix}:endpoints:version"

    @property
    def endpoint_public(self) -> str:
        """SET of the INFERENCE session ids whose endpoint is public (no token needed)."""
        return f"{self.prefix}:endpoints:public"

    @property
    def endpoint_tokens(self) -> str:
        """HASH SHA-256 of an endpoint token -> JSON ``stores.endpoint_access.EndpointToken`` (its id, endpoint, name,
        when issued); a revoked token is deleted."""
        return f"{self.prefix}:endpoints:tokens"

    @property
    def endpoint_held(self) -> str:
        """HASH ``<INFERENCE session id>|<activator instance>`` -> ``<requests held>|<lease end, unix s>``: the
        requests each gateway process's activator holds now, counted only while its lease runs (a crashed process's
        count lapses with it)."""
        return f"{self.prefix}:endpoints:held"

    @property
    def endpoint_stats(self) -> str:
        """HASH INFERENCE session id -> JSON ``stores.endpoint_access.EndpointStats``, the control plane's latest
        reading of HAProxy's counters of the endpoint (about once a second)."""
        return f"{self.prefix}:endpoints:stats"

    def endpoint_cold_starts(self, session_id: str) -> str:
        """LIST of JSON ``stores.endpoint_access.ColdStart``, newest first, the last few of one endpoint."""
        return f"{self.prefix}:endpoints:cold-starts:{session_id}"

    def endpoint_series(self, session_id: str) -> str:
        """LIST of JSON ``domain.endpoint_series.EndpointPoint``, oldest first, at most ``MAX_POINTS``: the endpoint's
        requests/s and replicas over the last hour (the Endpoints page's chart)."""
        return f"{self.prefix}:endpoints:series:{session_id}"

    def usage_record(self, session_id: str) -> str:
        """JSON of one ended session's raw usage record (``domain.usage.UsageRecord``); expires after the raw
        retention (``CARAVAN_USAGE_RAW_RETENTION``)."""
        return f"{self.prefix}:usage:record:{session_id}"

    @property
    def usage_records(self) -> str:
        """ZSET of the session ids whose raw usage records are kept, scored by when they ended (trimmed to the
        retention at each write)."""
        return f"{self.prefix}:usage:records"

    def usage_day(self, day: str) -> str:
        """HASH of one UTC day's rollup (``YYYY-MM-DD``): ``user␟project␟group␟type␟measure`` -> integer amount,
        incremented once per ended session in the MULTI that ends it; kept forever."""
        return f"{self.prefix}:usage:day:{day}"

    @property
    def usage_day_versions(self) -> str:
        """HASH day -> a counter incremented in the MULTI of every write to that day's rollup (``usage_day``)."""
        return f"{self.prefix}:usage:day-versions"

    def usage_day_compact(self, day: str) -> str:
        """One day's rollup as one document, with the version it was read at (a cache of ``usage_day`` a reader
        builds again when the day's version moved on): a month's report reads 30 documents, not 700,000 fields."""
        return f"{self.prefix}:usage:day-compact:{day}"

    @property
    def usage_days_compacted(self) -> str:
        """HASH day -> the version its compact document (``usage_day_compact``) was built at, written with it: the
        days whose version moved on since are the ones the scheduler leader compacts again."""
        return f"{self.prefix}:usage:days-compacted"

    @property
    def usage_totals(self) -> str:
        """HASH ``project␟measure`` -> integer amount of every ended session ever (Prometheus' counters)."""
        return f"{self.prefix}:usage:totals"

    def usage_utilization(self, session_id: str) -> str:
        """HASH the idle checker adds each sweep's measured utilization to: ``<metric>`` -> percent × seconds and
        ``<metric>:seconds`` -> seconds; read when the session ends."""
        return f"{self.prefix}:usage:utilization:{session_id}"

    def namespace_pool(self, node_id: str) -> str:
        """SET of the pooled network namespaces free on one Nomad client (container names), kept by its keeper
        (``nomad_jobs.namespace_keeper``: added once, when made); the scheduler claims one with SPOP at placement, so
        no two sessions are ever handed the same."""
        return f"{self.prefix}:netns-pool:{node_id}"
