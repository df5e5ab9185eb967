//! Wire-level checks: field numbers the kubelet depends on, and the tolerance of
//! unknown fields that the tessera.v1 versioning rule relies on.

use prost::Message;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::podresources::v1 as pr;
use tessera_proto::tessera::v1 as tv1;

/// The first byte of a length-delimited field is `(number << 3) | 2`.
fn delimited_tag(number: u8) -> u8 {
    (number << 3) | 2
}

#[test]
fn cdi_devices_are_field_5_of_container_allocate_response() {
    let response = dp::ContainerAllocateResponse {
        cdi_devices: vec![dp::CdiDevice {
            name: "nvidia.com/gpu=0".into(),
        }],
        ..Default::default()
    };
    let bytes = response.encode_to_vec();
    assert_eq!(bytes[0], delimited_tag(5));
}

#[test]
fn device_topology_is_field_3_and_register_options_field_4() {
    let device = dp::Device {
        topology: Some(dp::TopologyInfo { nodes: vec![] }),
        ..Default::default()
    };
    assert_eq!(device.encode_to_vec()[0], delimited_tag(3));
    let register = dp::RegisterRequest {
        options: Some(dp::DevicePluginOptions::default()),
        ..Default::default()
    };
    assert_eq!(register.encode_to_vec()[0], delimited_tag(4));
}

#[test]
fn dynamic_resource_starts_at_field_2_after_the_removed_class_name() {
    let resource = pr::DynamicResource {
        claim_name: "c".into(),
        ..Default::default()
    };
    assert_eq!(resource.encode_to_vec()[0], delimited_tag(2));
}

#[test]
fn unknown_fields_from_a_newer_peer_are_ignored() {
    let heartbeat = tv1::AgentMessage {
        body: Some(tv1::agent_message::Body::Heartbeat(tv1::Heartbeat {
            sequence: 7,
            sent_unix_ms: 1,
        })),
    };
    let mut bytes = heartbeat.encode_to_vec();
    // A later revision's field 99 (varint 1) on the envelope.
    bytes.extend_from_slice(&[0x98, 0x06, 0x01]);
    let decoded = tv1::AgentMessage::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded, heartbeat);
}

#[test]
fn an_unknown_message_kind_decodes_as_an_empty_body() {
    // A later revision's oneof case 42 (empty message): an older coordinator sees no
    // body and can skip the message instead of failing the stream.
    let bytes = [(42 << 3) | 2, 0x00];
    let decoded = tv1::AgentMessage::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.body, None);
}
