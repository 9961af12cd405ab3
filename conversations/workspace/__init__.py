"""The workspace around the chat: organising conversations (pins, folders, the archive, bulk
actions), share links, temporary chats, ratings of answers and prompt presets."""
