/* The workspace tools of the chat page, wired to the chat's store and actions: organising the
 * sidebar (organise.js, dialogs.js, bulk.js), sharing (share.js), how a chat starts (start.js),
 * saved prompts on "/" (slash.js). Ratings and math are drawn by message.js and markdown.js. */

import { $, announce } from "../dom.js";
import { createBulk } from "./bulk.js";
import { createFolderCommands, createOrganiseDialog, reloadFolders } from "./dialogs.js";
import { setOrganiseContext } from "./organise.js";
import { installShare } from "./share.js";
import { installSlashMenu } from "./slash.js";
import { installStart } from "./start.js";
import { loadBoot, workspace } from "./state.js";

export function installWorkspace(store, actions, boot, { confirm }) {
  loadBoot(boot);
  const folders = createFolderCommands(actions, confirm);
  const bulk = createBulk(store, actions, confirm);
  setOrganiseContext({
    actions,
    onOrganise: createOrganiseDialog(),
    onFolderRename: folders.rename,
    onFolderDelete: folders.remove,
    onSelection: bulk.update,
  });
  $("folder-new").addEventListener("click", folders.create);

  const archived = $("archived-toggle");
  archived.addEventListener("click", () => {
    workspace.archivedView = !workspace.archivedView;
    archived.setAttribute("aria-pressed", String(workspace.archivedView));
    workspace.selected.clear();
    bulk.update();
    announce(workspace.archivedView ? "Showing archived chats." : "Showing your chats.");
    actions.refreshConversations();
  });

  installShare(store, actions);
  installStart(store, actions);
  installSlashMenu();
  // The first list came with the page; draw it again grouped now that the folders are known.
  reloadFolders(actions);
}
