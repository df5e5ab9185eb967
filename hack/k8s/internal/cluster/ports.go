package cluster

import (
	"fmt"
	"net"
)

// freePort asks the kernel for an unused loopback port. The port is released before the caller
// binds it, so another process could take it in between; on a test machine that race is rare and
// shows up as a clear bind error rather than a wrong result.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
