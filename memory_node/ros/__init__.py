"""rclpy layer: nodes, parameters, replay, bag import, command-line client. Thin: converts,
then calls core; the wire formats it reads are in memory_node.wire."""
