"""ROS wire formats read and written without rclpy: the TF buffer and /tf's CDR reader, the
geometry they share, the image and point-cloud codecs. Below core (which uses them to pose and
decode what the recorder keeps): imports only the standard library, numpy and cv2, and ROS
message classes lazily where it builds a message (tests, the sample bag); nothing of
memory_node above it."""
