"""The "tolerant" congestion control for aioquic: loss recovery that random loss and reordering do not stall.

Chosen with `TENZRO_QUIC_CONGESTION=tolerant` and `TENZRO_QUIC_LIB=aioquic` (docs/operations.md;
why and what it measured: docs/performance.md, "Loss and reordering on the wire"). Two parts,
both deciding with the sans-I/O state machines of core/transport/loss_signals.py:

* a congestion controller that grows like NewReno (slow start, then one datagram per window,
  HyStart's RTT exit) but shrinks the window only when the loss is congestion
  (`CongestionSignal`: the queue grew, or the loss is heavy), and collapses it on persistent
  congestion as RFC 9002 asks;
* loss detection whose packet threshold adapts to the reordering seen (`ReorderingTolerance`),
  so a datagram that overtakes others no longer makes them "lost".

aioquic takes a congestion controller by name (its registry), but its loss detection is a fixed
class the connection builds; `install` gives the connection module a subclass that behaves as
aioquic's own unless the connection chose "tolerant". The QUIC library is handed in as modules
(quic_lib.py is the one place that imports one), so this module imports none.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .loss_signals import CongestionSignal, ReorderingTolerance

NAME = "tolerant"
ACK_RANGES = 256  # aioquic's 64 dropped datagrams reordered by more than 128 packets


def install(*, recovery: ModuleType, congestion: ModuleType, connection: ModuleType) -> None:
    """Register the controller with aioquic and put the adaptive loss detection in its connections.

    `recovery`, `congestion` and `connection` are aioquic.quic.recovery, aioquic.quic.congestion.base
    and aioquic.quic.connection. Idempotent.
    """
    if getattr(connection, "_tenzro_tolerant", False):
        return
    # The receiver's side, for every aioquic connection: aioquic takes a packet more than twice
    # MAX_ACK_RANGES (64) below the largest received for a duplicate and drops it, so a datagram
    # overtaken by 128 others (15 ms of reordering at 12 MB/s) was lost however the sender
    # detected it. It keeps as many ACK ranges as half its duplicate window; 256 ranges still
    # fit one ACK frame in a 1,200-byte datagram (at most ~4 bytes a range).
    recovery.MAX_ACK_RANGES = connection.MAX_ACK_RANGES = ACK_RANGES
    congestion.register_congestion_control(NAME, _controller_class(congestion))
    connection.QuicPacketRecovery = _recovery_class(recovery)
    connection._tenzro_tolerant = True


def _controller_class(congestion: ModuleType) -> type:
    base: Any = congestion.QuicCongestionControl
    minimum_window = congestion.K_MINIMUM_WINDOW

    class TolerantCongestionControl(base):
        """NewReno's growth; a window halved only for congestion, once per recovery period."""

        def __init__(self, *, max_datagram_size: int) -> None:
            super().__init__(max_datagram_size=max_datagram_size)
            self._datagram = max_datagram_size
            self._recovery_start = 0.0
            self._stash = 0
            self._rtt_monitor = congestion.QuicRttMonitor()
            self.signal = CongestionSignal(horizon_bytes=256 * max_datagram_size)
            self.reductions = 0  # loss events taken as congestion
            self.tolerated = 0  # loss events that left the window as it was
            self.undone = 0  # reductions taken back: their losses proved spurious
            self._before_reduction: tuple[int, int | None] | None = None  # (window, ssthresh) to restore
            self._reduction_lost = 0  # bytes declared lost in the last reduction's loss event
            self._reduction_spurious = 0  # ... and of those, or since, acknowledged after all
            self._slow_start_paused = False  # slow start left on heavy loss not yet confirmed

        def on_packet_acked(self, *, now: float, packet: Any) -> None:
            self.bytes_in_flight -= packet.sent_bytes
            self.signal.acked(packet.sent_bytes)
            if self._slow_start_paused and not self.signal.loss_heavy():
                self.ssthresh, self._slow_start_paused = None, False  # the loss was not a queue's
            if packet.sent_time <= self._recovery_start:
                return  # no growth for packets sent before the last reduction
            if self.ssthresh is None or self.congestion_window < self.ssthresh:
                self.congestion_window += packet.sent_bytes
                return
            self._stash += packet.sent_bytes
            if grown := self._stash // self.congestion_window:
                self._stash -= grown * self.congestion_window
                self.congestion_window += grown * self._datagram

        def on_packet_sent(self, *, packet: Any) -> None:
            self.bytes_in_flight += packet.sent_bytes

        def on_packets_expired(self, *, packets: Any) -> None:
            for packet in packets:
                self.bytes_in_flight -= packet.sent_bytes

        def on_packets_lost(self, *, now: float, packets: Any) -> None:
            latest_sent, lost_bytes = 0.0, 0
            for packet in packets:
                self.bytes_in_flight -= packet.sent_bytes
                self.signal.lost(packet.sent_bytes)
                latest_sent = max(latest_sent, packet.sent_time)
                lost_bytes += packet.sent_bytes
            if latest_sent <= self._recovery_start:
                self._reduction_lost += lost_bytes
                return  # the same loss event as the last reduction
            if not self.signal.is_congestion(now):
                self.tolerated += 1
                if self.signal.heavy_pending and self.ssthresh is None:
                    # Heavy loss in slow start: stop doubling until it is confirmed (a queue
                    # overflowing) or the rate falls back (spurious, or one burst): on_packet_acked
                    # resumes slow start then.
                    self.ssthresh, self._slow_start_paused = self.congestion_window, True
                return
            self.reductions += 1
            self.signal.reduced()
            # An undo restores slow start if the reduction ended a pause of it.
            self._before_reduction = (self.congestion_window, None if self._slow_start_paused else self.ssthresh)
            self._slow_start_paused = False
            self._reduction_lost, self._reduction_spurious = lost_bytes, 0
            self._recovery_start = now
            self.congestion_window = max(self.congestion_window // 2, minimum_window * self._datagram)
            self.ssthresh = self.congestion_window

        def on_spurious_loss(self, size: int) -> None:
            """Bytes declared lost were acknowledged after all (the recovery saw the ACK).

            They leave the loss rate; and once half of what the last reduction's loss event
            declared lost has proved spurious, the reduction is undone (as TCP undoes one,
            RFC 4015): the datagrams had been reordered, not dropped at a queue.
            """
            self.signal.not_lost(size)
            if self._before_reduction is None:
                return
            self._reduction_spurious += size
            if 2 * self._reduction_spurious >= self._reduction_lost:
                window, self.ssthresh = self._before_reduction
                self.congestion_window = max(self.congestion_window, window)
                self._before_reduction = None
                self.undone += 1

        def on_persistent_congestion(self) -> None:
            self.congestion_window = minimum_window * self._datagram
            self._recovery_start = 0.0
            self._before_reduction = None  # not undone: every packet for 3 PTOs was lost

        def on_rtt_measurement(self, *, now: float, rtt: float) -> None:
            if self.ssthresh is None and self._rtt_monitor.is_rtt_increasing(now=now, rtt=rtt):
                self.ssthresh = self.congestion_window  # HyStart: the queue is growing, leave slow start

        def get_log_data(self) -> dict[str, Any]:
            return {**super().get_log_data(), "reductions": self.reductions, "tolerated": self.tolerated,
                    "undone": self.undone}

    return TolerantCongestionControl


def _recovery_class(recovery: ModuleType) -> type:
    base: Any = recovery.QuicPacketRecovery

    class AdaptiveRecovery(base):
        """aioquic's recovery; with "tolerant", loss detection's thresholds follow the reordering seen."""

        def __init__(self, *, congestion_control_algorithm: str, **kwargs: Any) -> None:
            super().__init__(congestion_control_algorithm=congestion_control_algorithm, **kwargs)
            self.reordering = ReorderingTolerance() if congestion_control_algorithm == NAME else None

        def on_ack_received(self, *, ack_rangeset: Any, ack_delay: float, now: float, space: Any) -> None:
            if self.reordering is not None and space.is_application_data and \
                    (spurious_bytes := self.reordering.acknowledged(ack_rangeset)):
                self._cc.on_spurious_loss(spurious_bytes)
            sampled_before = (self._rtt_smoothed, self._rtt_latest)
            super().on_ack_received(ack_rangeset=ack_rangeset, ack_delay=ack_delay, now=now, space=space)
            if self.reordering is not None and (self._rtt_smoothed, self._rtt_latest) != sampled_before:
                # A new RTT sample, with the peer's ACK delay taken out (RFC 9002 5.3), which the
                # controller's own on_rtt_measurement is not given.
                self._cc.signal.rtt_sample(self._rtt_latest, now)

        def _detect_loss(self, *, now: float, space: Any) -> None:
            if self.reordering is None:
                super()._detect_loss(now=now, space=space)
                return
            # aioquic's _detect_loss with the adaptive thresholds, noting each declaration so that
            # a late ACK for the packet can raise the threshold that made it.
            tolerance = self.reordering
            rtt = max(self._rtt_latest, self._rtt_smoothed) if self._rtt_initialized else self._rtt_initial
            loss_delay = tolerance.time_factor * rtt
            packet_threshold = space.largest_acked_packet - tolerance.packet_threshold
            time_threshold = now - loss_delay
            lost = []
            space.loss_time = None
            for packet_number, packet in space.sent_packets.items():
                if packet_number > space.largest_acked_packet:
                    break
                by_time = packet.sent_time <= time_threshold
                if by_time or packet_number <= packet_threshold:
                    lost.append(packet)
                    if space.is_application_data:
                        tolerance.declared_lost(packet_number, largest_acked=space.largest_acked_packet,
                                                size=packet.sent_bytes, by_time=by_time)
                else:
                    loss_time = packet.sent_time + loss_delay
                    if space.loss_time is None or space.loss_time > loss_time:
                        space.loss_time = loss_time
            self._on_packets_lost(now=now, packets=lost, space=space,
                                  persistent_congestion=self._in_persistent_congestion(packets=lost))

    return AdaptiveRecovery
