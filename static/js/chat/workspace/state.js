/* The workspace's own state beside the chat store: folders, presets, the sidebar's modes
 * (selecting, the archive) and how the next conversation starts. The chat store stays the
 * one source of conversations and messages; these are read by the sidebar's grouping and the
 * start options, and changed only by the workspace modules. */

export const workspace = {
  folders: [],
  presets: [],
  allowPublicShares: false,
  archivedView: false,
  selecting: false,
  selected: new Set(),
  collapsed: new Set(), // folder ids shown shut
  next: { presetId: "", temporary: false }, // how the next conversation starts
};

export function loadBoot(boot) {
  workspace.folders = boot.folders || [];
  workspace.presets = boot.presets || [];
  workspace.allowPublicShares = Boolean(boot.allow_public_shares);
}

/** The body of "start a conversation" (the chat's create endpoint). */
export function startOptions() {
  const body = {};
  if (workspace.next.presetId) body.preset_id = Number(workspace.next.presetId);
  if (workspace.next.temporary) body.temporary = true;
  return body;
}

/** Extra query parameters of the conversation list. */
export function listParams() {
  return workspace.archivedView ? "&archived=1" : "";
}

export const folderName = (id) => (workspace.folders.find((f) => f.id === id) || {}).name || "";
