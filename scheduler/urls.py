from django.urls import path

from scheduler import openai_api

openai_urlpatterns = [
    path("models", openai_api.ModelListApi.as_view(), name="v1-models"),
    path("models/<path:model>", openai_api.ModelDetailApi.as_view(), name="v1-model"),
    path("chat/completions", openai_api.chat_completions, name="v1-chat-completions"),
    path("completions", openai_api.completions, name="v1-completions"),
]
