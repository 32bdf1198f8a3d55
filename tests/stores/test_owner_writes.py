"""Folders and committed images have two writers, the gateway (asks) and the scheduler's job owner (acts): on a real
Redis, neither loses what the other wrote, a restore cannot race a purge, and the owner writes only under its
leader's current term.

Where a test needs the other writer to land between a read and a write, it writes through a second connection from
inside the change being applied: that is the interleaving under test (named where it happens), not a fake."""

from __future__ import annotations

from datetime import timedelta

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from core.clock import utcnow
from core.codec import encode
from core.errors import Conflict, InvalidInput, QuotaExceeded
from core.keys import Keys
from core.lease import Fence, LostLease
from core.settings import Settings, StorageSettings
from domain.images import CommittedImage, ImageStatus
from domain.storage import Folder, FolderStatus, mode_for, new_folder, purge_claim
from domain.users import Role, User
from stores.folders import FolderStore
from stores.images import ImageStore

ALICE = User(id="alice", name="alice", role=Role.USER)
BOB = User(id="bob", name="bob", role=Role.USER)
NO_GRACE = StorageSettings(trash_grace=0.0)
WHERE = {"node_id": "node-a", "volume_id": "vol-1", "host_path": "/srv/vol-1"}


@pytest.fixture
async def fence(redis: Redis, keys: Keys) -> Fence:
    """The scheduler's current term (token 7)."""
    await redis.set(keys.scheduler_fence, 7)
    return Fence(key=keys.scheduler_fence, token=7)


@pytest.fixture
def folders(redis: Redis, keys: Keys) -> FolderStore:
    return FolderStore(redis, keys)


async def created(folders: FolderStore, name: str = "data") -> Folder:
    folder = new_folder(name=name, owner=ALICE, project="default", now=utcnow())
    await folders.create(folder, StorageSettings())
    return folder


def volume_made(folder: Folder) -> Folder:
    """The job owner's change once Nomad made the volume (``FolderOwner._create``)."""
    return folder.evolve(
        status=FolderStatus.READY if folder.status is FolderStatus.CREATING else folder.status, **WHERE
    )


async def test_a_gateway_change_applies_to_the_folder_as_stored_when_it_writes(
    folders: FolderStore, redis: Redis, keys: Keys, redis_settings: Settings
) -> None:
    folder = await created(folders)
    owner = SyncRedis.from_url(redis_settings.redis.url)
    calls: list[str] = []

    def rename(current: Folder) -> Folder:
        calls.append(current.status.value)
        if len(calls) == 1:  # the interleaving: the job owner's write lands between the gateway's read and write
            owner.set(keys.folder(folder.id), encode(volume_made(current)))
        return current.evolve(name="renamed")

    stored = await folders.update(folder.id, rename, StorageSettings())
    owner.close()
    assert calls == ["CREATING", "READY"]  # applied again to the newer folder
    assert stored is not None and (stored.status, stored.name, stored.volume_id) == (
        FolderStatus.READY,
        "renamed",
        "vol-1",
    )
    assert await folders.get(folder.id) == stored
    assert await redis.get(keys.folder_name("alice", "renamed")) == folder.id
    assert not await redis.exists(keys.folder_name("alice", "data"))


async def test_the_owner_keeps_what_the_gateway_changed_meanwhile(
    folders: FolderStore, redis: Redis, keys: Keys, fence: Fence
) -> None:
    folder = await created(folders)
    assert await redis.sismember(keys.folders_to_create, folder.id)
    await folders.update(folder.id, lambda f: f.evolve(name="renamed", shared_with_users={"bob": "RO"}), NO_GRACE)

    stored = await folders.settle(folder.id, volume_made, fence)  # from the folder as it read it before: CREATING
    assert stored is not None
    assert (stored.status, stored.name, stored.host_path) == (FolderStatus.READY, "renamed", "/srv/vol-1")
    assert mode_for(BOB, stored) is not None
    assert not await redis.sismember(keys.folders_to_create, folder.id)  # the request is done


async def test_a_folder_trashed_before_its_volume_was_made_is_made_when_restored(
    folders: FolderStore, redis: Redis, keys: Keys, fence: Fence
) -> None:
    folder = await created(folders)
    await folders.update(
        folder.id, lambda f: f.evolve(status=FolderStatus.TRASHED, trashed_at=utcnow()), StorageSettings()
    )
    await folders.settle(folder.id, lambda f: None, fence)  # the owner finds it trashed: nothing to make
    assert not await redis.sismember(keys.folders_to_create, folder.id)

    restored = await folders.update(
        folder.id, lambda f: f.evolve(status=FolderStatus.CREATING, trashed_at=None), NO_GRACE
    )
    assert restored is not None and restored.status is FolderStatus.CREATING
    assert await redis.sismember(keys.folders_to_create, folder.id)  # asked again: not stuck CREATING
    assert await redis.zscore(keys.folders_to_purge, folder.id) is None


async def test_a_purge_once_claimed_is_not_undone_and_a_restore_before_it_wins(
    folders: FolderStore, redis: Redis, keys: Keys, fence: Fence
) -> None:
    now = utcnow()
    doomed, kept = await created(folders, "doomed"), await created(folders, "kept")
    for folder in (doomed, kept):
        await folders.settle(folder.id, volume_made, fence)
        trashed_at = now - timedelta(seconds=1)
        await folders.update(
            folder.id, lambda f, at=trashed_at: f.evolve(status=FolderStatus.TRASHED, trashed_at=at), NO_GRACE
        )  # type: ignore[misc]
    assert set(await redis.zrange(keys.folders_to_purge, 0, -1)) == {doomed.id, kept.id}

    # kept is restored before the owner claims its purge: the claim leaves it alone
    await folders.update(kept.id, lambda f: f.evolve(status=FolderStatus.READY, trashed_at=None), NO_GRACE)
    left = await folders.settle(kept.id, lambda f: purge_claim(f, NO_GRACE, now), fence)
    assert left is not None and left.status is FolderStatus.READY

    claimed = await folders.settle(doomed.id, lambda f: purge_claim(f, NO_GRACE, now), fence)
    assert claimed is not None and claimed.status is FolderStatus.PURGING
    assert mode_for(BOB, claimed.evolve(shared_with_users={"bob": "RW"})) is None  # nobody else sees it any more
    again = await folders.settle(doomed.id, lambda f: purge_claim(f, NO_GRACE, now), fence)  # after a crash
    assert again is not None and again.status is FolderStatus.PURGING
    assert await redis.zscore(keys.folders_to_purge, doomed.id) is not None  # still the owner's work until forgotten

    await folders.forget(claimed, fence)
    assert await folders.get(doomed.id) is None
    assert await redis.zrange(keys.folders_to_purge, 0, -1) == []


def test_the_purge_claim_waits_for_the_grace() -> None:
    now = utcnow()
    folder = new_folder(name="x", owner=ALICE, project="default", now=now)
    grace = StorageSettings(trash_grace=60.0)
    trashed = folder.evolve(status=FolderStatus.TRASHED, trashed_at=now)
    assert purge_claim(trashed, grace, now + timedelta(seconds=59)) is None
    claimed = purge_claim(trashed, grace, now + timedelta(seconds=60))
    assert claimed is not None and claimed.status is FolderStatus.PURGING
    assert purge_claim(folder, grace, now + timedelta(days=9)) is None  # not trashed
    assert purge_claim(claimed, grace, now + timedelta(days=9)) is None  # claimed already


async def test_a_gateway_change_may_refuse_the_folder_as_it_is_now(folders: FolderStore) -> None:
    folder = await created(folders)
    other = await created(folders, "other")

    def refuse(current: Folder) -> Folder:
        raise InvalidInput("no", field="id")

    with pytest.raises(InvalidInput):
        await folders.update(folder.id, refuse, NO_GRACE)
    with pytest.raises(Conflict):
        await folders.update(folder.id, lambda f: f.evolve(name=other.name), NO_GRACE)
    assert await folders.get(folder.id) == folder
    assert await folders.update("no-such-folder", lambda f: f.evolve(name="x"), NO_GRACE) is None


async def test_the_owner_writes_only_under_the_current_term(
    folders: FolderStore, redis: Redis, keys: Keys, fence: Fence
) -> None:
    folder = await created(folders)
    stale = Fence(key=fence.key, token=fence.token - 1)  # a paused old leader
    with pytest.raises(LostLease):
        await folders.settle(folder.id, volume_made, stale)
    with pytest.raises(LostLease):
        await folders.forget(folder, stale)
    with pytest.raises(LostLease):
        await folders.postpone_purge(folder.id, utcnow(), stale)
    assert await folders.get(folder.id) == folder
    assert await redis.sismember(keys.folders_to_create, folder.id)


# -- committed images --


@pytest.fixture
def images(redis: Redis, keys: Keys) -> ImageStore:
    return ImageStore(redis, keys)


async def committing(images: ImageStore) -> CommittedImage:
    image = CommittedImage(
        id="img-1",
        ref="caravan/u-alice-tools:1",
        owner_id="alice",
        project="default",
        session_id="s-1",
        node_id="node-a",
        container="main-alloc",
        created_at=utcnow(),
    )
    await images.ask(image)
    return image


async def test_an_image_is_deleted_only_once_committed(
    images: ImageStore, redis: Redis, keys: Keys, fence: Fence
) -> None:
    image = await committing(images)
    with pytest.raises(Conflict):  # its docker commit would race the docker rmi
        await images.ask_delete(image.id)
    assert (await images.get(image.id)) == image

    assert await images.done(image, image.evolve(status=ImageStatus.READY), fence)
    deleting = await images.ask_delete(image.id)
    assert deleting is not None and deleting.status is ImageStatus.DELETING
    assert await images.ask_delete(image.id) == deleting  # asked twice: the same
    assert await redis.sismember(keys.images_to_act_on, image.id)
    assert await images.ask_delete("no-such-image") is None


async def test_the_owner_does_not_overwrite_what_was_asked_since_it_read_the_image(
    images: ImageStore, redis: Redis, keys: Keys, fence: Fence
) -> None:
    image = await committing(images)
    ready = image.evolve(status=ImageStatus.READY)
    await images.done(image, ready, fence)
    await images.ask_delete(image.id)

    # an owner that read it READY (a repeat of the commit round) must not write READY over the DELETING asked since
    assert not await images.done(ready, ready, fence)
    stored = await images.get(image.id)
    assert stored is not None and stored.status is ImageStatus.DELETING
    assert await redis.sismember(keys.images_to_act_on, image.id)  # the delete request stays for the next round

    with pytest.raises(LostLease):
        await images.done(stored, None, Fence(key=fence.key, token=fence.token - 1))
    assert await images.done(stored, None, fence)  # removed on its node: forgotten
    assert await images.get(image.id) is None
    assert not await redis.sismember(keys.images_of_owner("alice"), image.id)
    assert not await redis.sismember(keys.images_to_act_on, image.id)


async def test_a_reference_is_claimed_by_one_image_and_freed_once_it_is_forgotten(
    images: ImageStore, redis: Redis, keys: Keys, fence: Fence
) -> None:
    image = (await committing(images)).evolve(id="img-new", ref="caravan/u/alice/tools:1")
    await images.ask(image)
    with pytest.raises(InvalidInput) as taken:  # the same reference again, even by a racing commit: refused
        await images.ask(image.evolve(id="img-again"))
    assert taken.value.field == "tag"
    assert await images.get("img-again") is None
    assert await images.named(["caravan/u/alice/tools:1", "caravan/busybox:1"], owners=[]) == {image.ref: [image]}

    await images.done(image, image.evolve(status=ImageStatus.READY), fence)
    deleting = await images.ask_delete(image.id)
    assert deleting is not None and await images.done(deleting, None, fence)
    assert await images.named([image.ref], owners=["alice"]) == {}
    await images.ask(image.evolve(id="img-later"))  # free again


async def test_an_image_from_before_the_claims_resolves_through_its_owners_records(
    images: ImageStore, redis: Redis, keys: Keys
) -> None:
    """As the code before injective references stored it: the document and its indexes, no claim."""
    legacy = CommittedImage(
        "img-old", "caravan/u-alice-tools:1", "alice", "default", "s", "node-a", "c", utcnow(), ImageStatus.READY
    )
    await redis.set(keys.image(legacy.id), encode(legacy))
    await redis.sadd(keys.images_of_owner("alice"), legacy.id)
    await redis.sadd(keys.images_of_project("default"), legacy.id)
    assert await images.named([legacy.ref], owners=["alice", "bob"]) == {legacy.ref: [legacy]}
    assert await images.named([legacy.ref], owners=["bob"]) == {}  # bob's records: none has it


async def test_a_recount_never_overwrites_what_the_file_api_counted_during_its_walk(folders: FolderStore) -> None:
    """The recount's total replaces the folder's usage only if nothing was counted since its walk began: an upload's
    reservation counted meanwhile was set back by a total that did not hold it, and the next upload then passed the
    bytes quota (seen in CI: a 1-byte upload accepted over a full quota)."""
    folder = await created(folders)
    quota = StorageSettings(max_bytes_per_user=100)
    await folders.set_usage(folder.id, 100)
    mark = await folders.usage_mark(folder.id)  # the walk begins
    with pytest.raises(QuotaExceeded):
        await folders.reserve(folder, 1, credit=0, quota=quota)  # refused: counted and taken back, so unchanged
    assert await folders.recounted(folder.id, 90, mark)
    assert await folders.usage([folder.id]) == {folder.id: 90}
    mark = await folders.usage_mark(folder.id)
    await folders.reserve(folder, 10, credit=0, quota=quota)  # an upload's bytes, counted before they are on disk
    assert not await folders.recounted(folder.id, 90, mark)  # the walk did not see them: not stored
    assert await folders.usage([folder.id]) == {folder.id: 100}
    with pytest.raises(QuotaExceeded):
        await folders.reserve(folder, 1, credit=0, quota=quota)
    await folders.forget(folder, None)  # purged meanwhile: no usage left behind
    assert not await folders.recounted(folder.id, 5, await folders.usage_mark(folder.id))
