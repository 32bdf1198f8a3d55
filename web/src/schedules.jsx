// Recurring schedules (placeholder until the page lands).
export default function SchedulesPage() {
  return <p class="empty">Schedules: coming.</p>;
}
