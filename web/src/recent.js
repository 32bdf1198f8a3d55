// The launcher's recent launches: the five latest launch forms of this browser's user, kept in the browser's
// localStorage (per user id, never sent anywhere: the form as typed, which may hold environment values). Pinned ones
// stay when newer launches push the others out; each can be renamed. Pure list operations, and the storage beside them.
export const MAX_RECENT = 5;
const key = (userId) => `caravan:recent-launches:${userId}`;

export function loadRecent(userId) {
  try {
    const list = JSON.parse(localStorage.getItem(key(userId)) || "[]");
    return Array.isArray(list) ? list.filter((r) => r && typeof r.id === "string" && r.form) : [];
  } catch {
    return [];
  }
}

export function saveRecent(userId, list) {
  try {
    localStorage.setItem(key(userId), JSON.stringify(list));
  } catch {
    /* storage full or disabled: kept for the page */
  }
  return list;
}

/** `list` with `form` launched at `now` first: the oldest unpinned launches dropped past MAX_RECENT (pinned ones stay). */
export function addRecent(list, form, now) {
  const entry = {
    id: `${now}-${Math.random().toString(36).slice(2, 8)}`,
    label: form.name || "session",
    at: now,
    pinned: false,
    form: { ...form, templateName: "" },
  };
  const next = [entry, ...list];
  while (next.length > MAX_RECENT) {
    const drop = next.map((r) => !r.pinned).lastIndexOf(true);
    if (drop < 0) break;
    next.splice(drop, 1);
  }
  return next;
}

export const renameRecent = (list, id, label) => list.map((r) => (r.id === id ? { ...r, label } : r));
export const togglePin = (list, id) => list.map((r) => (r.id === id ? { ...r, pinned: !r.pinned } : r));
