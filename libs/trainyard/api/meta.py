"""The common model base and the metav1 types.

Every API model derives from :class:`KubeModel`: snake_case attributes in Python, camelCase
keys on the wire, and fields the model does not type are kept verbatim as extra data so that
``dump(parse(doc)) == doc``. Only keys that were present in the input (or assigned later) are
dumped, so absent fields stay absent and explicit ``null`` values stay ``null``.

Schema facts that only matter for generated CRDs and defaulting (descriptions, server-side
defaults, CEL rules, list types) are attached to fields with :func:`crd_field`; the CRD
generator and :func:`trainyard.api.defaults.apply_defaults` read them from there, so the
models are the single source of truth for both.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# Keys of ``json_schema_extra`` understood by the CRD generator and the defaulting walk.
SERVER_DEFAULT = "x-trainyard-server-default"


class KubeModel(BaseModel):
    """Base of all API models: camelCase aliases, extras preserved, unset fields omitted."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="allow",
        strict=True,
        # Explicit ``null`` values are kept (they are part of the document).
        revalidate_instances="never",
    )

    # The Kubernetes OpenAPI definition this model mirrors (``io.k8s.api.core.v1.Container``);
    # set on models of built-in Kubernetes types, whose CRD schema is inlined from the pinned
    # definitions instead of being derived from the (partial) model fields.
    k8s_definition: ClassVar[str | None] = None

    @model_validator(mode="after")
    def _unset_fields_named_like_extras(self) -> "KubeModel":
        # pydantic counts every input key as "set", so an unknown key spelled like a field's
        # Python name (``num_nodes``) would also mark that field set and dump it as null.
        extra = self.__pydantic_extra__
        if extra:
            for name in extra.keys() & type(self).model_fields.keys():
                if getattr(self, name) is None:
                    self.__pydantic_fields_set__.discard(name)
        return self

    # Dumps default to the wire form (only fields that were set): a full dump would turn every
    # absent field into an explicit null, which Kubernetes patches read as "delete this".
    def model_dump(self, *, exclude_unset: bool = True, **kwargs: Any) -> dict[str, Any]:
        return super().model_dump(exclude_unset=exclude_unset, **kwargs)

    def model_dump_json(self, *, exclude_unset: bool = True, **kwargs: Any) -> str:
        return super().model_dump_json(exclude_unset=exclude_unset, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: camelCase keys, only fields that were set, extras verbatim."""
        return self.model_dump(by_alias=True, exclude_unset=True)

    @classmethod
    def from_dict(cls, data: Any) -> "KubeModel":
        """Parse wire data strictly by wire names (snake_case keys become extra data)."""
        return cls.model_validate(data, by_alias=True, by_name=False)


def crd_field(
    description: str = "",
    *,
    required: bool = False,
    alias: str | None = None,
    server_default: Any = None,
    rules: list[tuple[str, str]] | None = None,
    list_type: str | None = None,
    map_keys: list[str] | None = None,
    map_type: str | None = None,
    **schema: Any,
) -> Any:
    """A model field with the schema facts a CRD needs.

    ``server_default`` is the OpenAPI ``default`` the API server fills in for an absent field
    (applied here by ``apply_defaults``); ``rules`` are ``(CEL rule, message)`` pairs; other
    keyword arguments (``minLength``, ``minimum``, ``format``...) go into the schema as written.
    """
    extra: dict[str, Any] = dict(schema)
    if server_default is not None:
        extra[SERVER_DEFAULT] = server_default
    if rules:
        extra["x-kubernetes-validations"] = [{"message": msg, "rule": rule} for rule, msg in rules]
    if list_type:
        extra["x-kubernetes-list-type"] = list_type
    if map_keys:
        extra["x-kubernetes-list-map-keys"] = map_keys
    if map_type:
        extra["x-kubernetes-map-type"] = map_type
    return Field(
        ... if required else None,
        description=description or None,
        alias=alias,
        json_schema_extra=extra or None,
    )


class SchemaFormat:
    """Annotation marker: the OpenAPI ``format`` of an integer or string type."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt

    def __repr__(self) -> str:
        return f"SchemaFormat({self.format!r})"


class IntOrStringMarker:
    """Annotation marker for ``x-kubernetes-int-or-string`` values."""


class QuantityMarker:
    """Annotation marker for ``resource.Quantity`` values (int-or-string with a pattern)."""


def _validate_int_or_string(value: Any) -> int | str:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    raise PydanticCustomError("int_or_string", "Input should be an integer or a string")


def _validate_quantity(value: Any) -> int | float | str:
    # Kept exactly as written: 2 stays 2, "1Gi" stays "1Gi", 0.5 stays 0.5.
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return value
    raise PydanticCustomError("quantity", "Input should be a quantity (a number or a string like 1Gi)")


Int32 = Annotated[int, SchemaFormat("int32")]
Int64 = Annotated[int, SchemaFormat("int64")]
DateTime = Annotated[str, SchemaFormat("date-time")]
IntOrString = Annotated[int | str, PlainValidator(_validate_int_or_string), IntOrStringMarker()]
Quantity = Annotated[int | float | str, PlainValidator(_validate_quantity), QuantityMarker()]


class OwnerReference(KubeModel):
    """A reference to the object that owns this one (used for garbage collection)."""

    k8s_definition: ClassVar[str | None] = "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference"

    api_version: str = Field(alias="apiVersion")
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(KubeModel):
    """Standard object metadata (metav1.ObjectMeta)."""

    k8s_definition: ClassVar[str | None] = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None


class LocalObjectReference(KubeModel):
    """A reference to an object by name in the same namespace."""

    k8s_definition: ClassVar[str | None] = "io.k8s.api.core.v1.LocalObjectReference"

    name: str | None = None


class Condition(KubeModel):
    """A standard status condition (metav1.Condition)."""

    k8s_definition: ClassVar[str | None] = "io.k8s.apimachinery.pkg.apis.meta.v1.Condition"

    type: str
    status: str
    observed_generation: int | None = None
    last_transition_time: str | None = None
    reason: str | None = None
    message: str | None = None


class KubeObject(KubeModel):
    """A top-level API object: apiVersion, kind, metadata (the rest per kind).

    Subclasses set ``API_VERSION`` and ``KIND``; an object built in Python gets them filled in,
    so its dump is a complete document.
    """

    API_VERSION: ClassVar[str | None] = None
    KIND: ClassVar[str | None] = None
    NAMESPACED: ClassVar[bool] = True

    api_version: str | None = Field(None, alias="apiVersion")
    kind: str | None = None
    metadata: ObjectMeta | None = None

    def model_post_init(self, context: Any, /) -> None:
        cls = type(self)
        if self.api_version is None and cls.API_VERSION and "api_version" not in self.model_fields_set:
            self.api_version = cls.API_VERSION
        if self.kind is None and cls.KIND and "kind" not in self.model_fields_set:
            self.kind = cls.KIND


class GenericObject(KubeObject):
    """An object of a kind trainyard does not model: everything kept as extra data."""
