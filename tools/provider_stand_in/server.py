"""The stand-in provider process: Terraform plugin protocol 6 over gRPC, served from a schema JSON.

Terraform starts it as ``terraform-provider-NAME`` (a launcher script made by
:mod:`tools.provider_stand_in.environment`), reads the go-plugin handshake line from its stdout and
talks gRPC over a unix socket with mutual TLS (``PLUGIN_CLIENT_CERT``).

It accepts every configuration (Terraform itself checks arguments, types and references against
the schema), plans the proposed new state with null computed attributes unknown, and applies by
filling unknowns with placeholders of the right type. It talks to no cloud. A planned change of an
attribute the real provider marks ForceNew (``force_new.json``, see
:mod:`tools.provider_stand_in.force_new`) requires replacement, as it would there.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import importlib
import json
import os
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tools.provider_stand_in import values

JSON = Any
_NESTING = {"single": 1, "list": 2, "set": 3, "map": 4, "group": 5}
FORCE_NEW = Path(__file__).with_name("force_new.json")


def force_new_paths(provider_source: str, path: Path = FORCE_NEW) -> dict[str, list[str]]:
    """Per resource type, the attribute paths whose change makes the real provider replace it."""
    document = json.loads(path.read_text())
    own = document.get("provider differences", {}).get(provider_source.rsplit("/", 1)[-1], {})
    return {**document["resources"], **own}


class StandInProvider:
    """The Provider service's handlers, each taking and returning protobuf messages."""

    def __init__(
        self, pb: Any, schema: dict[str, JSON], force_new: dict[str, list[str]] | None = None
    ) -> None:
        self.pb = pb
        self.schema = schema
        self.force_new = force_new or {}
        self.resources: dict[str, JSON] = schema.get("resource_schemas", {})
        self.data_sources: dict[str, JSON] = schema.get("data_source_schemas", {})
        self._schema_response: Any = None

    # -- schema
    def _attribute(self, name: str, attr: dict[str, JSON]) -> Any:
        pb = self.pb
        out = pb.Schema.Attribute(
            name=name,
            required=bool(attr.get("required")),
            optional=bool(attr.get("optional")),
            computed=bool(attr.get("computed")),
            sensitive=bool(attr.get("sensitive")),
            description=attr.get("description", ""),
        )
        if "nested_type" in attr:
            nested = attr["nested_type"]
            out.nested_type.CopyFrom(
                pb.Schema.Object(
                    attributes=[self._attribute(n, a) for n, a in sorted(nested["attributes"].items())],
                    nesting=_NESTING[nested["nesting_mode"]],
                )
            )
        else:
            out.type = json.dumps(attr["type"]).encode()
        return out

    def _block(self, block: dict[str, JSON]) -> Any:
        pb = self.pb
        return pb.Schema.Block(
            attributes=[self._attribute(n, a) for n, a in sorted(block.get("attributes", {}).items())],
            block_types=[
                pb.Schema.NestedBlock(
                    type_name=n,
                    block=self._block(b["block"]),
                    nesting=_NESTING[b["nesting_mode"]],
                    min_items=b.get("min_items", 0),
                    max_items=b.get("max_items", 0),
                )
                for n, b in sorted(block.get("block_types", {}).items())
            ],
        )

    def _schema(self, entry: dict[str, JSON]) -> Any:
        return self.pb.Schema(version=entry.get("version", 0), block=self._block(entry["block"]))

    def GetProviderSchema(self, request: Any, context: Any) -> Any:
        if self._schema_response is None:
            pb = self.pb
            response = pb.GetProviderSchema.Response(
                provider=self._schema(self.schema["provider"]),
                server_capabilities=pb.ServerCapabilities(plan_destroy=False),
            )
            for name, entry in self.resources.items():
                response.resource_schemas[name].CopyFrom(self._schema(entry))
            for name, entry in self.data_sources.items():
                response.data_source_schemas[name].CopyFrom(self._schema(entry))
            self._schema_response = response
        return self._schema_response

    def GetMetadata(self, request: Any, context: Any) -> Any:
        pb = self.pb
        return pb.GetMetadata.Response(
            server_capabilities=pb.ServerCapabilities(),
            resources=[pb.GetMetadata.ResourceMetadata(type_name=n) for n in self.resources],
            data_sources=[pb.GetMetadata.DataSourceMetadata(type_name=n) for n in self.data_sources],
        )

    # -- validation and configuration: Terraform has already checked the config against the schema
    def ValidateProviderConfig(self, request: Any, context: Any) -> Any:
        return self.pb.ValidateProviderConfig.Response()

    def ValidateResourceConfig(self, request: Any, context: Any) -> Any:
        return self.pb.ValidateResourceConfig.Response()

    def ValidateDataResourceConfig(self, request: Any, context: Any) -> Any:
        return self.pb.ValidateDataResourceConfig.Response()

    def ConfigureProvider(self, request: Any, context: Any) -> Any:
        return self.pb.ConfigureProvider.Response()

    def StopProvider(self, request: Any, context: Any) -> Any:
        return self.pb.StopProvider.Response()

    # -- resources
    def _dynamic(self, value: Any) -> Any:
        return self.pb.DynamicValue(msgpack=values.encode(value))

    def UpgradeResourceState(self, request: Any, context: Any) -> Any:
        block = self.resources[request.type_name]["block"]
        raw = json.loads(request.raw_state.json) if request.raw_state.json else None
        state = values.from_json(raw, values.block_type(block))
        return self.pb.UpgradeResourceState.Response(upgraded_state=self._dynamic(state))

    def ReadResource(self, request: Any, context: Any) -> Any:
        block = self.resources[request.type_name]["block"]
        state = values.fill_unknowns(values.decode(request.current_state.msgpack), values.block_type(block))
        return self.pb.ReadResource.Response(new_state=self._dynamic(state), private=request.private)

    def PlanResourceChange(self, request: Any, context: Any) -> Any:
        block = self.resources[request.type_name]["block"]
        proposed = values.decode(request.proposed_new_state.msgpack)
        prior = values.decode(request.prior_state.msgpack)
        planned = (
            proposed
            if proposed is None or prior is not None
            else values.mark_computed(proposed, block, False)
        )
        replace = []
        if prior is not None and planned is not None:
            force_new = self.force_new.get(request.type_name, [])
            replace = [self._path(p) for p in values.replace_paths(prior, planned, block, force_new)]
        return self.pb.PlanResourceChange.Response(
            planned_state=self._dynamic(planned),
            requires_replace=replace,
            planned_private=request.prior_private,
        )

    def _path(self, steps: values.AttributePath) -> Any:
        step = self.pb.AttributePath.Step
        return self.pb.AttributePath(
            steps=[step(attribute_name=s) if isinstance(s, str) else step(element_key_int=s) for s in steps]
        )

    def ApplyResourceChange(self, request: Any, context: Any) -> Any:
        block = self.resources[request.type_name]["block"]
        planned = values.decode(request.planned_state.msgpack)
        new_state = None if planned is None else values.fill_unknowns(planned, values.block_type(block))
        return self.pb.ApplyResourceChange.Response(
            new_state=self._dynamic(new_state), private=request.planned_private
        )

    def ImportResourceState(self, request: Any, context: Any) -> Any:
        block = self.resources[request.type_name]["block"]
        state = values.empty_object(block)
        if "id" in state:
            state["id"] = request.id
        pb = self.pb
        imported = pb.ImportResourceState.ImportedResource(
            type_name=request.type_name, state=self._dynamic(state)
        )
        return pb.ImportResourceState.Response(imported_resources=[imported])

    def ReadDataSource(self, request: Any, context: Any) -> Any:
        block = self.data_sources[request.type_name]["block"]
        config = values.decode(request.config.msgpack)
        state = values.fill_unknowns(values.mark_computed(config, block, True), values.block_type(block))
        return self.pb.ReadDataSource.Response(state=self._dynamic(state))


_METHODS = [
    "GetMetadata",
    "GetProviderSchema",
    "ValidateProviderConfig",
    "ValidateResourceConfig",
    "ValidateDataResourceConfig",
    "UpgradeResourceState",
    "ConfigureProvider",
    "ReadResource",
    "PlanResourceChange",
    "ApplyResourceChange",
    "ImportResourceState",
    "ReadDataSource",
    "StopProvider",
]


def _self_signed_cert() -> tuple[bytes, bytes, bytes]:
    """A fresh key and self-signed certificate for ``localhost``: (key PEM, cert PEM, cert DER)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return (
        key_pem,
        cert.public_bytes(serialization.Encoding.PEM),
        cert.public_bytes(serialization.Encoding.DER),
    )


def serve(schema_path: Path, provider_source: str, gen_dir: Path) -> None:
    """Serve the provider until Terraform shuts it down."""
    sys.path.insert(0, str(gen_dir))
    pb = importlib.import_module("tfplugin6_pb2")
    document = json.loads(schema_path.read_text())
    provider = StandInProvider(
        pb, document["provider_schemas"][provider_source], force_new_paths(provider_source)
    )
    stopped = threading.Event()

    handlers = {}
    for method in _METHODS:
        request_class = getattr(pb, method).Request
        handlers[method] = grpc.unary_unary_rpc_method_handler(
            getattr(provider, method),
            request_deserializer=request_class.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )

    def shutdown(request: bytes, context: Any) -> bytes:
        stopped.set()
        return b""

    def stdio(request: bytes, context: Any) -> Any:
        return iter(())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("tfplugin6.Provider", handlers),
            grpc.method_handlers_generic_handler(
                "plugin.GRPCController", {"Shutdown": grpc.unary_unary_rpc_method_handler(shutdown)}
            ),
            grpc.method_handlers_generic_handler(
                "plugin.GRPCStdio", {"StreamStdio": grpc.unary_stream_rpc_method_handler(stdio)}
            ),
        )
    )
    with tempfile.TemporaryDirectory(prefix="tf-stand-in-") as tmp:
        socket_path = os.path.join(tmp, "plugin.sock")
        key_pem, cert_pem, cert_der = _self_signed_cert()
        # Terraform's client checks this server's certificate (sent in the handshake line); the
        # socket lies in a private temporary folder, so the client is not asked for one.
        credentials = grpc.ssl_server_credentials([(key_pem, cert_pem)], require_client_auth=False)
        server.add_secure_port(f"unix:{socket_path}", credentials)
        server.start()
        cert_field = base64.b64encode(cert_der).decode().rstrip("=")
        sys.stdout.write(f"1|6|unix|{socket_path}|grpc|{cert_field}\n")
        sys.stdout.flush()
        parent = os.getppid()
        while not stopped.wait(1.0) and os.getppid() == parent:
            pass  # until Terraform shuts the plugin down, or dies without doing so
        server.stop(grace=0.2)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the launcher scripts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--schema", type=Path, required=True, help="schema JSON (providers schema -json layout)"
    )
    parser.add_argument(
        "--source", required=True, help="provider source, e.g. registry.terraform.io/hashicorp/google"
    )
    parser.add_argument(
        "--gen", type=Path, required=True, help="folder holding the compiled tfplugin6_pb2.py"
    )
    args, _ = parser.parse_known_args(argv)
    serve(args.schema, args.source, args.gen)


if __name__ == "__main__":
    main()
