"""The workspace's URLs: JSON endpoints under /chat/, pages under /settings/ and /shares/,
and the shared pages under /s/<token>/."""

from django.urls import path

from conversations.workspace import organise, presets, ratings, shares, starting

urlpatterns = [
    path("chat/folders/", organise.folder_list, name="folder-list"),
    path("chat/folders/new/", organise.folder_create, name="folder-create"),
    path("chat/folders/<int:pk>/rename/", organise.folder_rename, name="folder-rename"),
    path("chat/folders/<int:pk>/delete/", organise.folder_delete, name="folder-delete"),
    path("chat/conversations/bulk/", organise.bulk, name="conversation-bulk"),
    path("chat/conversations/<int:pk>/organise/", organise.organise, name="conversation-organise"),
    path("chat/conversations/<int:pk>/share/", shares.share_create, name="share-create"),
    path("chat/conversations/<int:pk>/close/", starting.close_temporary, name="conversation-close"),
    path("chat/messages/<int:pk>/rate/", ratings.rate, name="message-rate"),
    path("chat/presets/", presets.preset_list, name="preset-list"),
    path("settings/presets/", presets.presets_page, name="presets"),
    path("settings/presets/<int:pk>/delete/", presets.preset_delete, name="preset-delete"),
    path("shares/", shares.my_shares, name="my-shares"),
    path("shares/<int:pk>/revoke/", shares.share_revoke, name="share-revoke"),
    path("s/<str:token>/", shares.share_page, name="share-page"),
    path("s/<str:token>/continue/", shares.share_continue, name="share-continue"),
]
