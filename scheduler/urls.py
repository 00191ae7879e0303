from django.urls import path

from scheduler import openai_api

openai_urlpatterns = [
    path("models", openai_api.ModelListApi.as_view(), name="v1-models"),
    path("models/<path:model>", openai_api.ModelDetailApi.as_view(), name="v1-model"),
]

# --- Files and batches (issue 6) ------------------------------------------------------
from scheduler import batch_api  # noqa: E402

openai_urlpatterns += [
    path("files", batch_api.FileListCreateApi.as_view(), name="v1-files"),
    path("files/<str:file_id>", batch_api.FileDetailApi.as_view(), name="v1-file"),
    path("files/<str:file_id>/content", batch_api.FileContentApi.as_view(), name="v1-file-content"),
    path("batches", batch_api.BatchListCreateApi.as_view(), name="v1-batches"),
    path("batches/<str:batch_id>", batch_api.BatchDetailApi.as_view(), name="v1-batch"),
    path(
        "batches/<str:batch_id>/cancel", batch_api.BatchCancelApi.as_view(), name="v1-batch-cancel"
    ),
]
